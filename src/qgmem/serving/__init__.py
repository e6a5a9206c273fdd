"""Serving an export: load it (folder or hub id), build or load memory, answer questions.

Needs torch, PyG, safetensors, transformers and huggingface_hub only: neither Lightning nor the
training code.

```python
from qgmem.serving import QGMemPipeline
pipe = QGMemPipeline.from_pretrained("checkpoints/export")
pipe.remember([[{"speaker": "User", "text": "I moved to Lisbon last spring."}]])
print(pipe.answer(["Where do I live?"])[0].answer)
```
"""

from qgmem.model.pretrained import ExportFormatError, GraphTokenEncoder, HiddenSizeMismatch
from qgmem.serving.pipeline import NO_MEMORY_ANSWER, QGMemPipeline
from qgmem.serving.records import GRAPH_MODES, Answer, Retrieved

__all__ = ["GRAPH_MODES", "NO_MEMORY_ANSWER", "Answer", "ExportFormatError", "GraphTokenEncoder",
           "HiddenSizeMismatch", "QGMemPipeline", "Retrieved"]
