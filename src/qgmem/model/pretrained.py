"""The exported graph-token network as a Hub-style pretrained model: save, load (folder or hub id), push.

An export folder (or Hub repository) holds:

- ``graph_encoder.safetensors``: the encoder + projector weights (no pickle);
- ``config.json``: ``format``/``format_version``, the network shape (``graph_token``), the LM, the answer
  contract (``answer``: the prompt, the activation, the default graph mode), the sentence encoder, the
  construction settings and the run's metrics;
- ``lora_adapter/``: LoRA adapters of the frozen LM in PEFT's own format (``adapter_config.json`` +
  ``adapter_model.safetensors``), present only for a LoRA run, applied by ``PeftModel.from_pretrained``;
- ``README.md``: the model card with YAML metadata (:mod:`qgmem.model.card`);
- ``checksums.json`` (format version 3 on): the size and SHA-256 of the weight files (the encoder's and
  the adapter's), written last and checked at load (:mod:`qgmem.integrity`), so flipped bytes or a cut
  file are an :class:`~qgmem.errors.IntegrityError` naming the file. ``config.json`` and the card are
  text, checked field by field instead, and may be edited by hand.

Saving, loading and pushing go through ``huggingface_hub``'s :class:`~huggingface_hub.ModelHubMixin`,
so a hub id works wherever a folder does. Loading checks ``format_version`` and refuses a config whose
shapes disagree with the weights, naming the config field, and weights that are unreadable or hold a
NaN or an inf (the rule the export follows when it writes them), naming the file or the tensor.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelHubMixin
from safetensors.torch import load_file, save_file
from torch_geometric.data import Batch, Data

from qgmem.model.graph_modes import UNKNOWN_UNIT, empty_graph
from qgmem.errors import ExportFormatError, InputPathError, IntegrityError
from qgmem.finite import nonfinite_names
from qgmem.integrity import plain_mode, restore_replaced, seal, verify_sealed
from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
from qgmem.model import checkpoint_keys as CK
from qgmem import older_records

WEIGHTS_FILE = "graph_encoder.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"
ADAPTER_DIR = "lora_adapter"
FORMAT = "qgmem-graph-token"
FORMAT_VERSION = 5
#: versions this code reads: 1 (prompt settings mixed with notes, LoRA as a bare safetensors file), 2 (no
#: checksums), 3 (``checksums.json`` of the weight files), 4 (K named ``num_graph_tokens`` in every
#: block: ``graph_token``, ``prompt`` and ``readout``, where 3 said ``num_queries`` / ``graph_tokens``) and
#: 5 (the answer contract as one ``answer`` block: ``prompt``, ``activation``, ``graph_mode``, where 4 kept
#: them at the top level, and the mode the weights trained with as ``checkpoint.graph_mode``, where 4 said
#: ``trained_graph_mode``)
READABLE_VERSIONS = (1, 2, 3, 4, 5)
#: the first version whose exports carry ``checksums.json`` (older ones load unverified, with a warning)
SEALED_VERSION = 3
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: what fixes an export that fails its checks
EXPORT_HINT = "run `qgmem export --ckpt CHECKPOINT --out FOLDER` again to write the export anew"
logger = logging.getLogger("qgmem.model")


class HiddenSizeMismatch(ExportFormatError):
    """The export's graph tokens do not live in the target LM's embedding space."""


def _flat_ints(prefix: str, value: Any) -> dict[str, int]:
    """``{"graph_token.encoder.hidden": 256, ...}``: every integer field of a nested config."""
    if isinstance(value, dict):
        out: dict[str, int] = {}
        for key, inner in value.items():
            out.update(_flat_ints(f"{prefix}.{key}", inner))
        return out
    return {prefix: value} if isinstance(value, int) and not isinstance(value, bool) else {}


def _candidates(fields: dict[str, int], value: int, weight: str) -> list[str]:
    """Config fields equal to ``value``; those of the weight's own sub-module (``encoder.*``) first."""
    matches = [f for f, v in fields.items() if v == value]
    own = [f for f in matches if f.startswith(f"graph_token.{weight.split('.')[0]}.")]
    return own or matches or ["graph_token"]


def shape_mismatch_message(config: dict[str, Any], expected: dict[str, torch.Tensor],
                           found: dict[str, torch.Tensor], source: str) -> str | None:
    """Why ``found`` weights cannot fill a network built from ``config`` (``None`` when they can).

    The config field is named by matching the disagreeing size against the config's integer fields
    (``graph_token.encoder.hidden`` is 256 and the weights have 128 there), and a layer count by the
    indices of the repeated layers present in the weights.
    """
    fields = _flat_ints("graph_token", config)
    for name, tensor in expected.items():
        if name in found and tuple(found[name].shape) != tuple(tensor.shape):
            got = tuple(found[name].shape)
            for dim, (want, have) in enumerate(zip(tensor.shape, got)):
                if want != have:
                    named = _candidates(fields, want, name)
                    return (f"{source}: config field {' or '.join(named)} = {want} disagrees with the weights: "
                            f"'{name}' has size {have} in dimension {dim} (shape {list(got)}, expected "
                            f"{list(tensor.shape)})")
            return f"{source}: weight '{name}' has shape {list(got)}, the config builds {list(tensor.shape)}"
    missing, unexpected = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if not missing and not unexpected:
        return None
    layered = re.compile(r"^(.*?)\.(\d+)\.")
    for key in unexpected + missing:
        m = layered.match(key)
        if m:
            stem = m.group(1)
            built = {int(mm.group(2)) for k in expected if (mm := layered.match(k)) and mm.group(1) == stem}
            have = {int(mm.group(2)) for k in found if (mm := layered.match(k)) and mm.group(1) == stem}
            if built != have:
                named = [f for f, v in fields.items() if v == len(built)] or ["graph_token"]
                return (f"{source}: config field {' or '.join(named)} = {len(built)} disagrees with the weights, "
                        f"which have {len(have)} '{stem}.*' layers")
    return (f"{source}: the weights do not match the config 'graph_token' (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})")


def peft_adapter_state(lm_state: dict[str, torch.Tensor], adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """LoRA weights from a training checkpoint (``lm.base_model.….lora_A.default.weight``) under the key
    names PEFT saves (``base_model.….lora_A.weight``), so ``PeftModel.from_pretrained`` loads them."""
    out = {}
    for key, value in lm_state.items():
        key = key[len(CK.LM_PREFIX):] if key.startswith(CK.LM_PREFIX) else key
        out[key.replace(f".{adapter_name}.", ".")] = value.contiguous()
    return out


class GraphTokenEncoder(GraphTokenNet, ModelHubMixin, library_name="qgmem",
                        tags=["graph-token", "conversational-memory", "qgmem"],
                        repo_url="https://arxiv.org/abs/2610.11920"):
    """The exported encoder + projector, its ``export_config`` (``config.json``) and optional LoRA adapter."""

    def __init__(self, net_config: GraphTokenConfig, export_config: dict[str, Any] | None = None,
                 adapter: dict[str, torch.Tensor] | None = None):
        super().__init__(net_config)
        self.export_config = dict(export_config or {})
        self.export_config.setdefault("graph_token", net_config.to_dict())
        self.adapter = adapter  # PEFT-named LoRA weights, with export_config["lora"] their LoraConfig
        self.source: str | None = None  # the folder it was loaded from (where lora_adapter/ lives)

    # ------------------------------------------------------------------------------------------ save
    def _save_pretrained(self, save_directory: Path) -> None:
        from qgmem import __version__
        from qgmem.model.card import model_card

        save_directory = Path(save_directory)
        config = {"format": FORMAT, "format_version": FORMAT_VERSION, "qgmem_version": __version__,
                  **{k: v for k, v in self.export_config.items() if k not in ("format", "format_version")},
                  "graph_token": self.config.to_dict()}
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(save_directory / WEIGHTS_FILE), metadata={"format": FORMAT})
        plain_mode(save_directory / WEIGHTS_FILE)  # 0644 like config.json, not safetensors' 0600
        if self.adapter:
            self._save_adapter(save_directory / ADAPTER_DIR, config)
        (save_directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str) + "\n")
        (save_directory / CARD_FILE).write_text(model_card(config))
        weight_files = [WEIGHTS_FILE] + ([f"{ADAPTER_DIR}/{name}" for name in ADAPTER_FILES] if self.adapter else [])
        seal(save_directory, weight_files)  # last: a folder with checksums.json is complete

    def _save_adapter(self, folder: Path, config: dict[str, Any]) -> None:
        from peft import LoraConfig

        lora = dict(config.get("lora") or {})
        if not lora:
            raise ValueError("an adapter without its LoRA settings (export_config['lora']) cannot be saved")
        folder.mkdir(parents=True, exist_ok=True)
        LoraConfig(r=int(lora["r"]), lora_alpha=int(lora["alpha"]), lora_dropout=float(lora.get("dropout", 0.0)),
                   target_modules=list(lora["target_modules"]), task_type="CAUSAL_LM",
                   base_model_name_or_path=(config.get("lm") or {}).get("id")).save_pretrained(str(folder))
        save_file({k: v.detach().cpu().contiguous() for k, v in self.adapter.items()},
                  str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        plain_mode(folder / "adapter_model.safetensors")

    # ------------------------------------------------------------------------------------------ load
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, expected_hidden_size: int | None = None,
                        device: str | torch.device = "cpu", revision: str | None = None,
                        cache_dir: str | Path | None = None, force_download: bool = False,
                        local_files_only: bool = False, token: str | bool | None = None) -> GraphTokenEncoder:
        """Load an export from a local folder or a hub id (``owner/name``; the hub cache serves it offline).

        ``expected_hidden_size``: the serving LM's hidden size; a different size is refused, since a
        token trained for one embedding space is meaningless in another.
        """
        return cls._from_pretrained(model_id=str(pretrained_model_name_or_path), revision=revision,
                                    cache_dir=cache_dir, force_download=force_download,
                                    local_files_only=local_files_only, token=token,
                                    expected_hidden_size=expected_hidden_size, device=device)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None = None, cache_dir: str | Path | None = None,
                         force_download: bool = False, local_files_only: bool = False,
                         token: str | bool | None = None, expected_hidden_size: int | None = None,
                         device: str | torch.device = "cpu", **_ignored: Any) -> GraphTokenEncoder:
        folder = resolve_export(model_id, revision=revision, cache_dir=cache_dir, force_download=force_download,
                                local_files_only=local_files_only, token=token)
        return cls.load_folder(folder, expected_hidden_size=expected_hidden_size, device=device)

    @classmethod
    def load_folder(cls, folder: str | Path, expected_hidden_size: int | None = None,
                    device: str | torch.device = "cpu") -> GraphTokenEncoder:
        """Load and check one export folder (eval mode, no gradients)."""
        folder = Path(folder)
        config = read_export_config(folder)
        weights_path = folder / WEIGHTS_FILE
        if not weights_path.is_file():
            raise InputPathError(f"{weights_path} is missing: {folder} is not a complete QGMem export")
        try:
            net_config = GraphTokenConfig.from_dict(config["graph_token"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ExportFormatError(f"{folder / CONFIG_FILE}: field 'graph_token' is not a valid network "
                                    f"config: {exc}") from exc
        if expected_hidden_size is not None and int(expected_hidden_size) != net_config.lm_hidden:
            raise HiddenSizeMismatch(
                f"{folder}: field 'graph_token.lm_hidden' is {net_config.lm_hidden} (trained for LM "
                f"{(config.get('lm') or {}).get('id')!r}), but the serving LM has hidden size {expected_hidden_size}; "
                "export an encoder trained against this LM instead")
        if config.get("format_version", 0) >= SEALED_VERSION:
            verify_sealed(folder, hint=EXPORT_HINT)
        else:
            logger.warning("%s: a version-%s export carries no checksums and is loaded unverified; re-export it "
                           "to have its weights checked", folder, config.get("format_version"))
        model = cls(net_config, config)
        state = read_weights(weights_path)
        problem = shape_mismatch_message(config["graph_token"], model.state_dict(), state, str(folder))
        if problem:
            raise ExportFormatError(problem)
        model.load_state_dict(state, strict=True)
        adapter = folder / ADAPTER_DIR / "adapter_model.safetensors"
        if config.get("lora") and adapter.is_file():
            read_weights(adapter)  # checked finite here; PEFT loads it with the LM
        model.source = str(folder)
        model.requires_grad_(False)
        return model.to(device).eval()

    @property
    def adapter_dir(self) -> Path | None:
        """``lora_adapter/`` of the loaded export, or ``None`` when it was trained without LoRA."""
        if self.source is None:
            return None
        folder = Path(self.source) / ADAPTER_DIR
        return folder if (folder / "adapter_config.json").is_file() else None

    # ---------------------------------------------------------------------------------------- encode
    @torch.no_grad()
    def encode(self, graphs: Data | list[Data]) -> torch.Tensor:
        """Graph tokens for one graph or a list; empty graphs become one all-zero node."""
        graphs = [graphs] if isinstance(graphs, Data) else list(graphs)
        device = next(self.parameters()).device
        fixed = [_non_empty(g, self.config.feature_dim, self.config.edge_dim) for g in graphs]
        return self(Batch.from_data_list(fixed).to(device))


def _non_empty(graph: Data, dim: int, edge_dim: int) -> Data:
    """The tensors the encoder reads (``edge_fact`` too when present, ``edge_unit`` always: unknown where the
    graph lacks it); an empty graph is one zero node."""
    if graph.x is not None and graph.x.size(0) > 0:
        edge_attr = graph.edge_attr if graph.edge_attr is not None else graph.x.new_zeros((0, edge_dim))
        fact = getattr(graph, "edge_fact", None)
        extra = {"edge_fact": fact.float()} if fact is not None else {}
        units = getattr(graph, "edge_unit", None)
        extra["edge_unit"] = units.long() if units is not None else \
            torch.full((graph.edge_index.size(1),), UNKNOWN_UNIT, dtype=torch.long)
        words = getattr(graph, "node_word_ids", None)
        if words is not None:
            extra["node_word_ids"] = words.long()
        return Data(x=graph.x.float(), edge_index=graph.edge_index.long(), edge_attr=edge_attr.float(), **extra)
    return empty_graph(dim, edge_dim, facts=True)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one export weight file; unreadable or non-finite ones are refused, naming file and tensor."""
    from safetensors import SafetensorError

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise IntegrityError(f"{path}: unreadable safetensors file ({type(exc).__name__}: {exc})",
                             hint=EXPORT_HINT) from None
    bad = nonfinite_names(state)
    if bad:
        raise IntegrityError(f"{path}: {len(bad)} of {len(state)} weight tensors hold NaN or inf "
                             f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); refusing to load them",
                             hint=EXPORT_HINT)
    return state


def resolve_export(model_id: str | Path, *, revision: str | None = None, cache_dir: str | Path | None = None,
                   force_download: bool = False, local_files_only: bool = False,
                   token: str | bool | None = None) -> Path:
    """A local export folder as is; a hub id downloaded (or found in the hub cache when offline)."""
    path = Path(model_id)
    restore_replaced(path)  # an export whose replace was killed half-way is put back, not lost
    if path.is_dir():
        return path
    if path.exists():
        raise InputPathError(f"{path} is a file; an export is a folder (or a hub id such as 'user/qgmem-export')")
    if str(model_id).startswith((".", "/", "~")) or str(model_id).count("/") != 1:
        raise InputPathError(f"export {str(model_id)!r} does not exist (neither a folder nor a hub id 'owner/name')")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id=str(model_id), revision=revision, cache_dir=cache_dir,
                                      force_download=force_download, local_files_only=local_files_only, token=token))
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise InputPathError(f"export {str(model_id)!r}: not a local folder, and the hub repository could not "
                             f"be fetched ({type(exc).__name__}: {exc})") from exc


def read_export_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of an export, checked for ``format`` and ``format_version``; an older version's
    reads as today's (:func:`qgmem.older_records.read_export_config`)."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise InputPathError(f"{path} is missing: {folder} is not a QGMem export folder")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ExportFormatError(f"{path}: malformed JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise ExportFormatError(f"{path}: field 'format' is {found!r}, expected {FORMAT!r}")
    version = config.get("format_version")
    if version not in READABLE_VERSIONS:
        raise ExportFormatError(f"{path}: field 'format_version' is {version!r}; this qgmem reads versions "
                                f"{list(READABLE_VERSIONS)} (upgrade qgmem, or re-export the checkpoint)")
    return older_records.read_export_config(config, version, path)
