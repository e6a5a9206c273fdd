"""The distillation teacher: the frozen LM's answer-token distributions when it reads the full text.

Stage 2 of training the encoder to be read (the :class:`~qgmem.training.stages.Distillation` stage) pulls the student, the LM
reading the compact prompt (its top ``m`` units as text + the graph tokens), towards the same frozen LM
reading every unit of the working memory as text and no graph tokens. The teacher never changes during
a run, so its distributions are computed once per training sample and kept on disk: at each answer
token, the ids and logits of its ``k`` most likely next tokens (:class:`TeacherEntry`).

The cache is content-addressed, one safetensors file per sample. A sample's name is the SHA-256 of
:func:`teacher_key` (the LM id, dtype, config and a sample of its weights, the teacher's prompt contract
with its cap, the chat template, ``k``, the format) together with the teacher's prompt ids and the answer ids. Whatever changes
the teacher's outputs changes the name, so a changed setting or sample is a miss and is computed again;
the same sample in another run or fold is a hit. Each file records the SHA-256 of its tensors: a file
that does not load, or whose tensors do not match, is reported, recomputed and rewritten, never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from qgmem.errors import SettingError
from qgmem.integrity import write_text_atomic
from qgmem.model.fusion import IGNORE_INDEX, answer_logits, insert_token, shared_prefix_length
from qgmem.prompting import PromptEncoder, PromptSettings

log = logging.getLogger(__name__)

#: the teacher's prompt cap in text tokens: the full working memory (10 units) fits in it
TEACHER_PROMPT_TOKENS = 1024
#: the layout of an entry file; a new layout is a new key, so older files are never read as this one
TEACHER_FORMAT = 1
#: samples per teacher forward pass
TEACHER_BATCH = 8
_FIELDS = ("qa_id", "memory_text", "question", "answer")


@dataclass(frozen=True)
class TeacherEntry:
    """One sample's teacher targets: at each of its ``n`` answer tokens, the top ``k`` next-token ids and logits."""

    ids: torch.Tensor  # [n, k] long
    logits: torch.Tensor  # [n, k] float32, temperature 1, not normalized
    answer: torch.Tensor  # [n] long: the answer ids (end of turn included) the positions predict


def teacher_prompt(settings: PromptSettings, max_prompt_tokens: int = TEACHER_PROMPT_TOKENS) -> PromptSettings:
    """The run's prompt contract as the teacher reads it: every unit as text, its own cap, no graph slot."""
    return replace(settings, memory_units=None, include_memory_text=True, num_graph_tokens=None,
                   max_prompt_tokens=max_prompt_tokens)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def teacher_key(lm_id: str, lm, tokenizer, settings: PromptSettings, topk: int) -> dict[str, Any]:
    """Everything besides the sample that changes the teacher's outputs (``settings``: the teacher's prompt)."""
    config = {k: v for k, v in lm.config.to_dict().items() if k != "_name_or_path"}  # a folder's path is not content
    return {"format": TEACHER_FORMAT, "lm": lm_id, "dtype": str(lm.dtype).replace("torch.", ""),
            "lm_config": _sha(json.dumps(config, sort_keys=True, default=str)), "lm_weights": weights_sample(lm),
            "prompt": settings.to_dict(), "chat_template": _sha(str(getattr(tokenizer, "chat_template", None))),
            "graph": "none",  # legacy name of the graph mode, kept: the key of every teacher cache built
            "topk": int(topk)}


def weights_sample(lm, per_tensor: int = 1024) -> str:
    """SHA-256 of up to ``per_tensor`` evenly spaced values of each of the LM's own weights (not a LoRA
    adapter's): other weights under the same id and config (a folder retrained in place) are another key,
    at the cost of reading a few values per tensor."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, weight in lm.named_parameters():
            if "lora_" in name:
                continue
            flat = weight.detach().reshape(-1)
            values = flat[:: max(1, flat.numel() // per_tensor)].float().cpu()
            digest.update(f"{name}:{tuple(weight.shape)}|".encode() + values.numpy().tobytes())
    return digest.hexdigest()


class TeacherCache:
    """A folder of :class:`TeacherEntry` files named by their content (see the module docstring)."""

    def __init__(self, folder: str | Path, key: dict[str, Any]):
        self.folder = Path(folder)
        self.key = key
        self._prefix = _sha(json.dumps(key, sort_keys=True))

    def name(self, prompt_ids: Sequence[int], answer_ids: Sequence[int]) -> str:
        """A sample's entry name: the key with the teacher's prompt ids and the answer ids."""
        return _sha(f"{self._prefix}|{list(prompt_ids)}|{list(answer_ids)}")

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.safetensors"

    def load(self, name: str) -> TeacherEntry | None:
        """The entry, or ``None`` when it is missing; a corrupt file raises ``ValueError`` naming it."""
        from safetensors import safe_open

        path = self.path(name)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in ("ids", "logits", "answer")}
        except Exception as exc:  # a truncated or overwritten file: safetensors' own errors vary
            raise ValueError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
        if meta.get("name") != name or meta.get("sha256") != _digest(tensors):
            raise ValueError(f"{path}: checksum mismatch (the file changed after it was written)")
        return TeacherEntry(tensors["ids"].long(), tensors["logits"].float(), tensors["answer"].long())

    def save(self, name: str, entry: TeacherEntry) -> None:
        from safetensors.torch import save

        self.folder.mkdir(parents=True, exist_ok=True)
        tensors = {"ids": entry.ids.to(torch.int32).contiguous(), "logits": entry.logits.float().contiguous(),
                   "answer": entry.answer.to(torch.int32).contiguous()}
        write_text_atomic(self.path(name), save(tensors, metadata={"name": name, "sha256": _digest(tensors)}))


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        digest.update(f"{key}:{t.dtype}:{tuple(t.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def build_teacher(lm, lm_id: str, tokenizer, settings: PromptSettings, dataset, *, topk: int, folder: str | Path,
                  max_prompt_tokens: int = TEACHER_PROMPT_TOKENS, batch_size: int = TEACHER_BATCH,
                  progress: bool = True) -> tuple[dict[str, TeacherEntry], dict[str, Any]]:
    """The teacher entry of every sample of ``dataset``, by ``qa_id``: read from ``folder`` or computed and saved.

    ``settings`` is the run's prompt contract (the teacher reads it through :func:`teacher_prompt`).
    Returns the table and the counts: ``samples``, ``hits``, ``misses`` (computed now), ``corrupt``
    (files found damaged and rewritten), ``truncated`` (teacher prompts whose memory text did not fit
    the cap) and ``seconds``. A sample without ``qa_id``, ``memory_text``, ``question`` or ``answer``
    cannot be taught: a :class:`~qgmem.errors.SettingError` names the setting, the sample and the field.
    """
    started = time.perf_counter()
    settings = teacher_prompt(settings, max_prompt_tokens)
    encoder = PromptEncoder(tokenizer, settings)
    cache = TeacherCache(folder, teacher_key(lm_id, lm, tokenizer, settings, topk))
    names: dict[str, str] = {}  # qa_id -> entry name
    todo: dict[str, tuple[list[int], int, list[int]]] = {}  # entry name -> (prompt ids, head length, answer ids)
    table: dict[str, TeacherEntry] = {}
    stats = {"samples": len(dataset), "hits": 0, "misses": 0, "corrupt": 0, "truncated": 0}
    for index in range(len(dataset)):
        item = dataset[index]
        missing = next((f for f in _FIELDS if item.get(f) is None), None)
        if missing:
            raise SettingError(f"model.stages: Distillation needs the full-text teacher, but training sample {index} "
                               f"(qa_id {item.get('qa_id', '?')!r}) has no field {missing!r}")
        qa_id = str(item["qa_id"])
        prompt = encoder.prompt(item["memory_text"], item["question"])
        answer = encoder.answer(item["answer"])
        name = cache.name(prompt.ids, answer)
        if names.setdefault(qa_id, name) != name:
            raise SettingError(f"model.stages: Distillation looks teacher targets up by qa_id, but training samples "
                               f"share qa_id {qa_id!r} with different contents")
        stats["truncated"] += prompt.memory_tokens_dropped > 0
        if name in table or name in todo:
            continue
        try:
            entry = cache.load(name)
        except ValueError as exc:
            log.warning("teacher cache: %s; computing it again", exc)
            stats["corrupt"] += 1
            entry = None
        if entry is None:
            todo[name] = (prompt.ids, prompt.graph_pos, answer)
        else:
            table[name] = entry
    stats["hits"] = len(table)
    stats["misses"] = len(todo)
    if todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="teacher: answer distributions", unit="sample", disable=not progress)
        pending = list(todo.items())
        with torch.no_grad(), _without_adapters(lm):
            for start in range(0, len(pending), batch_size):
                chunk = pending[start:start + batch_size]
                for (name, _), entry in zip(chunk, teacher_forward(lm, [v for _, v in chunk], topk, encoder.pad_id)):
                    cache.save(name, entry)
                    table[name] = entry
                bar.update(len(chunk))
        bar.close()
    stats["seconds"] = time.perf_counter() - started
    return {qa_id: table[name] for qa_id, name in names.items()}, stats


def _without_adapters(lm):
    """The teacher is the LM without the run's LoRA adapters (if any)."""
    return lm.disable_adapter() if hasattr(lm, "disable_adapter") else nullcontext()


def teacher_forward(lm, samples: Sequence[tuple[list[int], int, list[int]]], topk: int,
                    pad_id: int) -> list[TeacherEntry]:
    """Top-``k`` answer-token logits of ``(prompt ids, head length, answer ids)`` samples, in one forward pass."""
    B = len(samples)
    T = max(len(p) + len(a) for p, _, a in samples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    for b, (p, _, a) in enumerate(samples):
        ids[b, : len(p) + len(a)] = torch.tensor(p + a)
        mask[b, : len(p) + len(a)] = 1
        labels[b, len(p): len(p) + len(a)] = torch.tensor(a)
    device = lm.get_input_embeddings().weight.device
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    heads = torch.tensor([h for _, h, _ in samples], device=device)
    embeds, mask, positions, labels = insert_token(lm.get_input_embeddings()(ids), mask, heads, None, labels)
    logits, _, rows = answer_logits(lm, embeds, mask, positions, labels, shared_prefix_length(ids, mask, heads))
    values, top = logits.topk(min(int(topk), logits.size(-1)), dim=-1)
    values, top, rows = values.float().cpu(), top.cpu(), rows.cpu()
    return [TeacherEntry(top[rows == b], values[rows == b], torch.tensor(a, dtype=torch.long))
            for b, (_, _, a) in enumerate(samples)]


__all__ = ["TEACHER_BATCH", "TEACHER_FORMAT", "TEACHER_PROMPT_TOKENS", "TeacherCache", "TeacherEntry",
           "build_teacher", "teacher_forward", "teacher_key", "teacher_prompt", "weights_sample"]
