"""Start a network from trained weights: an export folder, or a weights file such as the alignment stage's.

LLaVA-style: a run can begin from a projector someone trained before (``--model.init_from``). The
names and shapes are checked against the network the run builds, and a mismatch names the tensor and
the config field, so a file of another encoder shape never loads half.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from qgmem.errors import InputPathError
from qgmem.model.pretrained import WEIGHTS_FILE, ExportFormatError, shape_mismatch_message

#: where a run keeps its alignment stage's result (under ``trainer.default_root_dir``)
ALIGNMENT_DIR = "alignment"


def weights_file(path: str | Path) -> Path:
    """The weights of ``path``: an export folder's ``graph_encoder.safetensors``, or the file itself."""
    path = Path(path)
    file = path / WEIGHTS_FILE if path.is_dir() else path
    if not file.is_file():
        raise InputPathError(f"init_from {path}: no {WEIGHTS_FILE} there (expected an export folder or a "
                             ".safetensors file)")
    return file


def load_initial_weights(net: torch.nn.Module, path: str | Path) -> Path:
    """Load ``path``'s weights into ``net`` (every tensor, names and shapes checked); returns the file."""
    file = weights_file(path)
    try:
        state = load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise ExportFormatError(f"init_from {file}: not a readable safetensors file: {exc}") from exc
    expected = net.state_dict()
    problem = shape_mismatch_message(net.config.to_dict(), expected, state, f"init_from {file}")
    if problem:
        raise ExportFormatError(problem)
    net.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)
    return file


def save_weights(net: torch.nn.Module, folder: str | Path) -> Path:
    """``net``'s weights as ``folder/graph_encoder.safetensors`` (what ``init_from`` reads)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / WEIGHTS_FILE
    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(file))
    return file
