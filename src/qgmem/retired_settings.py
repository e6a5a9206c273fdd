"""Settings that tuning rounds added and later retired: how records that still hold them are read.

Exports, stores and caches written before a setting was retired record it (and cache and store keys
hash it). Today's code always behaves as one value of each, so a record holding that value reads as
it always did, and a record holding another value is refused by name: this version cannot reproduce
it (the git history holds the code that can). Caches and stores also keep their keys: a retired
setting that every key held keeps its place there with the value today's code uses.

Nothing here is a user's setting; ``ActivationConfig`` and ``ConstructionConfig`` strip these fields
from what they read and add the keyed ones to their keys. Retired command flags are refused by name,
saying what happens instead, whether given on the command line or in a ``--config`` file.
"""

from __future__ import annotations

from typing import Any

#: activation: retired field -> the value today's activation always uses
ACTIVATION_RETIRED: dict[str, object] = {
    "expansion_seeds": 0, "expansion_max_entity_units": 20, "feedback_seeds": 0, "hop_extra_units": 0,
    "fusion_weights": {}, "lexical_speaker_once": False, "superseded": "attach", "extra": {},
    # no default, preset or documented choice set them (reverse edges in the local graph; source text
    # in each working-memory entry)
    "reverse_edges": False, "source_chars": 0,
}
#: activation: retired fields that every cache key held (they were in the first keyed settings)
ACTIVATION_KEYED = ("superseded", "extra", "reverse_edges", "source_chars")
#: activation: a retired value of a field that stays
ACTIVATION_RETIRED_VALUES: dict[str, tuple[object, ...]] = {"dense_speaker_names": ("blend",)}

#: construction: retired field -> the value today's construction always uses
CONSTRUCTION_RETIRED: dict[str, object] = {"unread_turn_fallback": True, "source_turn_label": True}
#: construction: retired fields that store and cache keys held while they had today's value
CONSTRUCTION_KEYED = ("unread_turn_fallback",)


#: flags of ``qgmem eval-retrieval`` that no default or documented choice needed -> what happens instead
RETRIEVAL_EVAL_FLAGS: dict[str, str] = {
    "pool_size": "the fused pool is ActivationConfig's pool_size (100), or k when k is larger",
    "limit_per_category": "--limit N evaluates the first N cases",
    "device": "model rerankers run on cuda when it is available, else on the CPU",
}


def _read(values: dict[str, Any], retired: dict[str, object], what: str) -> dict[str, Any]:
    """``values`` without the ``retired`` fields. A field the record lacks reads as today's value: records
    written since the retirement lack it too. (A construction record written before
    ``unread_turn_fallback`` existed, which behaved as ``False``, therefore reads as ``True``.)"""
    values = dict(values)
    for name, today in retired.items():
        recorded = values.pop(name, today)
        if name == "fusion_weights":
            recorded = dict(recorded or {})
        if recorded != today:
            raise ValueError(f"{what} setting {name}={recorded!r} was retired; this version always uses "
                             f"{today!r} and cannot reproduce it")
    return values


def read_activation(values: dict[str, Any]) -> dict[str, Any]:
    """An activation record without its retired fields; a retired value it cannot reproduce is an error."""
    values = _read(values, ACTIVATION_RETIRED, "activation")
    for name, gone in ACTIVATION_RETIRED_VALUES.items():
        if values.get(name) in gone:
            raise ValueError(f"activation setting {name}={values[name]!r} was retired and cannot be reproduced")
    return values


def read_construction(values: dict[str, Any]) -> dict[str, Any]:
    """A construction record without its retired fields; a retired value this version cannot reproduce is
    an error."""
    return _read(values, CONSTRUCTION_RETIRED, "construction")


def activation_key(key: dict[str, Any]) -> dict[str, Any]:
    """``key`` with the retired fields every activation cache key held, at today's values."""
    return {**key, **{name: ACTIVATION_RETIRED[name] for name in ACTIVATION_KEYED}}


def construction_key(key: dict[str, Any]) -> dict[str, Any]:
    """``key`` with the retired construction fields that keys held, at today's values."""
    return {**key, **{name: CONSTRUCTION_RETIRED[name] for name in CONSTRUCTION_KEYED}}


def stored_source_label(meta: dict[str, Any]) -> bool:
    """Whether a store's source turns were embedded as ``speaker: text`` (its construction settings say
    so; a store recording none was built with the label). Only a store without source-turn vectors of
    its own needs this, to embed its turns as it would have."""
    return bool(meta.get("params", {}).get("source_turn_label", True))
