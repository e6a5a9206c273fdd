"""Property-based fuzzing of the three loaders (hypothesis).

One item of a valid file is damaged at a random place: a key deleted, a value replaced by another JSON
type, control characters or a very long string put in, the item repeated (a duplicate id), or the
file's text cut short. Whatever the damage: a strict load returns cases or raises a named
``UserError`` (never an exception from inside a library), and a lenient load never raises, counts
what it skipped, and keeps every undamaged item.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qgmem.data.loaders import load_cases
from qgmem.errors import UserError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

CONTROL = "".join(chr(c) for c in range(0, 32)) + "\x7f\u2028\u2029\ufeff\udcff"
odd_strings = st.one_of(
    st.text(alphabet=st.sampled_from(CONTROL), min_size=1, max_size=20),
    st.text(max_size=30),
    st.integers(min_value=10, max_value=60_000).map(lambda n: "long " * n),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | odd_strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(value, prefix=()):
    """Every (container path, key) inside ``value``: the places a damage can hit."""
    out = []
    if isinstance(value, dict):
        for key, child in value.items():
            out.append(prefix + (key,))
            out.extend(_paths(child, prefix + (key,)))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out.append(prefix + (i,))
            out.extend(_paths(child, prefix + (i,)))
    return out


def _parent(root, path):
    for step in path[:-1]:
        root = root[step]
    return root


@st.composite
def damage(draw, item):
    """A damaged deep copy of ``item`` and a word saying what was done."""
    item = copy.deepcopy(item)
    path = draw(st.sampled_from(_paths(item)))
    parent, key = _parent(item, path), path[-1]
    kind = draw(st.sampled_from(["delete", "replace", "control", "long"]))
    if kind == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif kind == "replace":
        parent[key] = draw(json_values)
    elif kind == "control":
        parent[key] = (parent[key] if isinstance(parent[key], str) else "") + draw(
            st.text(alphabet=st.sampled_from(CONTROL), min_size=1, max_size=8))
    else:
        parent[key] = "x" * draw(st.integers(min_value=20_000, max_value=200_000))
    return kind, item


def _check(dataset: str, path: Path, untouched_ids: set[str], damaged: bool, text_cut: bool = False):
    try:
        strict = load_cases(dataset, path)
    except UserError as exc:
        assert str(exc)  # a named error: says where
    else:
        assert untouched_ids <= {c.id for c in strict.cases}
    lenient = load_cases(dataset, path, strict=False)
    ids = {c.id for c in lenient.cases}
    if text_cut:  # the whole file is unreadable: one counted skip, or it still parsed
        assert lenient.report["skipped"] <= 1
        return
    assert untouched_ids <= ids  # every undamaged item kept
    assert lenient.report["skipped"] <= (1 if damaged else 0)
    assert lenient.report["skipped"] == len(lenient.report["skip_reasons"])


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("dataset", "fixture", "id_key"), [
    ("locomo", "locomo_small.json", "sample_id"),
    ("longmemeval", "longmemeval_small.json", "question_id"),
])
@FUZZ
@given(data=st.data())
def test_list_loaders_survive_any_damage_to_one_item(tmp_path_factory, dataset, fixture, id_key, data):
    doc = json.loads((FIXTURES / fixture).read_text(encoding="utf-8"))
    k = data.draw(st.integers(min_value=0, max_value=len(doc) - 1), label="damaged item")
    mode = data.draw(st.sampled_from(["damage", "duplicate", "cut"]), label="mode")
    untouched = {str(d[id_key]) for j, d in enumerate(doc) if j != k}
    folder = tmp_path_factory.mktemp(dataset)
    if mode == "duplicate":
        doc.append(copy.deepcopy(doc[k]))
        untouched.add(str(doc[k][id_key]))
        path = _write(folder / "data.json", json.dumps(doc))
        _check(dataset, path, untouched, damaged=True)
        return
    if mode == "cut":
        text = json.dumps(doc)
        cut = data.draw(st.integers(min_value=0, max_value=len(text) - 1), label="cut at")
        _check(dataset, _write(folder / "data.json", text[:cut]), set(), damaged=True, text_cut=True)
        return
    _, doc[k] = data.draw(damage(doc[k]), label="damage")
    _check(dataset, _write(folder / "data.json", json.dumps(doc)), untouched, damaged=True)  # escapes surrogates


@FUZZ
@given(data=st.data())
def test_convomem_survives_any_damage_to_one_item(tmp_path_factory, data):
    from tests_data_helpers import convomem_item, write_core  # the data tests' builders (see conftest.py)

    items = [convomem_item(i) for i in range(3)]
    k = data.draw(st.integers(min_value=0, max_value=2), label="damaged item")
    mode = data.draw(st.sampled_from(["damage", "duplicate", "cut"]), label="mode")
    root = tmp_path_factory.mktemp("convomem")
    base = "core_benchmark/evidence_questions/user_evidence/1_evidence/person-1_Tester.json"
    untouched = {f"{base.removesuffix('.json')}#{j}" for j in range(3) if j != k}
    if mode == "duplicate":  # the same item twice: its conversation id is claimed twice
        items.append(copy.deepcopy(items[k]))
        write_core(root, "user_evidence", json.dumps({"evidence_items": items}))
        _check("convomem", root, untouched | {f"{base.removesuffix('.json')}#{k}"}, damaged=True)
    elif mode == "cut":
        text = json.dumps({"evidence_items": items})
        cut = data.draw(st.integers(min_value=0, max_value=len(text) - 1), label="cut at")
        write_core(root, "user_evidence", text[:cut])
        _check("convomem", root, set(), damaged=True, text_cut=True)
    else:
        _, items[k] = data.draw(damage(items[k]), label="damage")
        write_core(root, "user_evidence", json.dumps({"evidence_items": items}))  # escapes lone surrogates
        _check("convomem", root, untouched, damaged=True)
    shutil.rmtree(root, ignore_errors=True)
