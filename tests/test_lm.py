"""The embedded LM's id is written once, in ``qgmem.lm``; everything else names ``EMBEDDED_LM``."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from qgmem.lm import EMBEDDED_LM, EMBEDDED_LM_NAME

ROOT = Path(__file__).resolve().parents[1]


def literal_ids(root: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """``file:line`` of each string literal naming the embedded LM (docstrings are prose, not settings)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name in skip:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and EMBEDDED_LM_NAME in node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_the_id_is_one_constant():
    assert EMBEDDED_LM == f"embedded:{EMBEDDED_LM_NAME}"
    for folder in ("src/qgmem", "tests", "bench"):
        assert literal_ids(ROOT / folder, skip=("lm.py",) if folder == "src/qgmem" else ()) == [], folder


def test_presets_name_it_as_the_constant():
    for preset in sorted((ROOT / "configs").glob("*.yaml")):
        config = yaml.safe_load(preset.read_text(encoding="utf-8"))
        for section in ("model", "data"):
            lm = (config.get(section) or {}).get("lm")
            assert lm is None or EMBEDDED_LM_NAME not in lm or lm == EMBEDDED_LM, (preset.name, section, lm)


def test_the_scan_finds_a_literal_and_passes_prose(tmp_path):  # positive and negative control
    (tmp_path / "a.py").write_text(f'"""Uses {EMBEDDED_LM_NAME}."""\nLM = "embedded:{EMBEDDED_LM_NAME}"\n'
                                   f'def f():\n    """{EMBEDDED_LM_NAME} again."""\n    # {EMBEDDED_LM_NAME}\n')
    assert literal_ids(tmp_path) == ["a.py:2"]


def test_the_input_embedding_table_alone_equals_the_loaded_lms(tiny_lm_path, monkeypatch):
    import safetensors
    import torch

    from qgmem.lm import load_causal_lm, load_input_embeddings

    read = []
    original = safetensors.safe_open

    class Spy:
        def __init__(self, *args, **kwargs):
            self.inner = original(*args, **kwargs)

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_tensor(self, key):
            read.append(key)
            return self.inner.get_tensor(key)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    table = load_input_embeddings(tiny_lm_path, dtype="float32")
    full = load_causal_lm(tiny_lm_path, dtype="float32").get_input_embeddings()
    assert read == ["model.embed_tokens.weight"] and [n for n, _ in table.named_parameters()] == ["weight"]
    assert torch.equal(table.weight, full.weight) and not table.weight.requires_grad
    assert load_input_embeddings(tiny_lm_path, dtype="bfloat16").weight.dtype == torch.bfloat16
