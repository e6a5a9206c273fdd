"""A Lightning callback the rehearsal adds (``--trainer.callbacks+=``) to observe a DDP fit from inside each rank.

It changes nothing: it records, per rank, the ``qa_id`` of every training and validation sample it saw,
a digest of the frozen LM's weights before and after fit, which parameters received a gradient, how often
the query projection of the LM's first decoder layer ran per training step (twice with gradient
checkpointing: the forward and its recomputation in backward; transformers checkpoints the layer's
``forward``, so a hook on the layer itself fires once either way, and torch stops a recomputation early
once the tensors backward needs are back, so a later op such as the MLP may not run again), the loss, and the peak RSS; and writes ``probe-rank<R>.json`` in ``out``.
"""

from __future__ import annotations

import hashlib
import json
import resource
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


def tensor_digest(tensors) -> str:
    h = hashlib.sha256()
    for name, t in tensors:
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class RehearsalProbe(Callback):
    def __init__(self, out: str):
        self.out = Path(out)
        self.rec: dict = {"train_qa_ids": [], "train_epochs": [], "val_qa_ids": [], "val_batches": 0, "losses": [],
                          "layer_calls_per_step": [], "grad_params": set(), "trainable": []}
        self._calls = 0

    def _lm(self, pl_module):
        return pl_module.lm

    def on_fit_start(self, trainer, pl_module) -> None:
        lm = self._lm(pl_module)
        self.rec["lm_digest_before"] = tensor_digest(lm.named_parameters())
        self.rec["lm_class"] = type(lm).__name__
        self.rec["lm_dtype"] = str(next(lm.parameters()).dtype)
        self.rec["trainable"] = sorted({n.split(".")[0] for n, p in pl_module.named_parameters() if p.requires_grad})
        self.rec["gradient_checkpointing"] = bool(getattr(lm, "is_gradient_checkpointing", False))
        inside = lm.get_decoder().layers[0].self_attn.q_proj  # the first op inside the checkpointed forward

        def count(*_):
            self._calls += 1

        inside.register_forward_hook(count)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._calls = 0
        self.rec["train_qa_ids"].append(list(batch.get("qa_id", [])) if isinstance(batch, dict) else [])
        self.rec["train_epochs"].append(trainer.current_epoch)

    def on_after_backward(self, trainer, pl_module) -> None:
        self.rec["grad_params"] |= {n.split(".")[0] for n, p in pl_module.named_parameters()
                                    if p.grad is not None and bool(p.grad.abs().sum() > 0)}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rec["layer_calls_per_step"].append(self._calls)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.rec["losses"].append(float(loss))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self.rec["val_batches"] += 1
            self.rec["val_qa_ids"] += list(batch.get("qa_id", [])) if isinstance(batch, dict) else []

    def on_fit_end(self, trainer, pl_module) -> None:
        lm = self._lm(pl_module)
        self.rec["lm_digest_after"] = tensor_digest(lm.named_parameters())
        self.rec["grad_params"] = sorted(self.rec["grad_params"])
        self.rec["rank"] = trainer.global_rank
        self.rec["world_size"] = trainer.world_size
        self.rec["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        self.rec["torch_threads"] = torch.get_num_threads()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"probe-rank{trainer.global_rank}.json").write_text(json.dumps(self.rec) + "\n")
