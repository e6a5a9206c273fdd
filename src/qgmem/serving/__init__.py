"""Serving an export: load it (folder or hub id), build or load memory, answer questions.

Needs torch, PyG, safetensors, transformers and huggingface_hub only: neither Lightning nor the
training code.

```python
from qgmem.serving import QGMemPipeline
pipe = QGMemPipeline.from_pretrained("checkpoints/export")
pipe.remember([[{"speaker": "User", "text": "I moved to Lisbon last spring."}]])
print(pipe.answer(["Where do I live?"])[0].answer)
```

The names below load on first use, so the commands (``qgmem serve``, ``qgmem answer``) parse their
flags, and answer ``--help``, without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qgmem.model.pretrained import ExportFormatError, GraphTokenEncoder, HiddenSizeMismatch
    from qgmem.serving.pipeline import NO_MEMORY_ANSWER, QGMemPipeline
    from qgmem.serving.records import GRAPH_MODES, Answer, Retrieved

#: name -> the module that defines it
_WHERE = {"ExportFormatError": "qgmem.model.pretrained", "GraphTokenEncoder": "qgmem.model.pretrained",
          "HiddenSizeMismatch": "qgmem.model.pretrained", "NO_MEMORY_ANSWER": "qgmem.serving.pipeline",
          "QGMemPipeline": "qgmem.serving.pipeline", "GRAPH_MODES": "qgmem.serving.records",
          "Answer": "qgmem.serving.records", "Retrieved": "qgmem.serving.records"}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
