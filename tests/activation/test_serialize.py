from __future__ import annotations

from qgmem.activation.graph import build_local_graph
from qgmem.activation.serialize import count_tokens, serialize_graph_triples, serialize_working_memory


def test_working_memory_entries_in_order_with_times_and_trajectory(small_store):
    units = [small_store.unit(u) for u in ("u4", "u0", "u2")]
    text = serialize_working_memory(units, small_store)
    assert text.splitlines() == [
        "[M1] Melanie now works as a pottery teacher (Melanie; turn 20) Trajectory: origin: Melanie works as "
        "a nurse at the city hospital -> update, current: this entry.",
        "[M2] Caroline went to a LGBTQ support group (Caroline; turn 1; happened 2023-05-07; said 2023-05-08)",
        "[M3] Caroline is researching adoption agencies (Caroline; turns 5-6)",
    ]
    assert "Trajectory" not in serialize_working_memory(units, None)
    assert serialize_working_memory([], small_store) == ""


def test_source_text_is_optional_and_cut(small_store):
    text = serialize_working_memory([small_store.unit("u5")], small_store, source_chars=12)
    assert text.endswith('Source: "Caroline ran..."')


def test_graph_triples_name_their_entries(small_store):
    graph = build_local_graph([small_store.unit(u) for u in ("u3", "u6")])
    assert serialize_graph_triples(graph).splitlines() == [
        "(Melanie; works as; nurse) [M1]",
        "(Melanie's kids; love; camping) [M2]",
    ]


def test_token_count_uses_the_lm_tokenizer(small_store, smollm2_tokenizer):
    text = serialize_working_memory(small_store.units, small_store)
    n = count_tokens(text, smollm2_tokenizer)
    assert n == len(smollm2_tokenizer(text, add_special_tokens=False).input_ids)
    assert 0 < n < len(text)  # BPE tokens are fewer than characters
    assert count_tokens("", smollm2_tokenizer) == 0


def test_trajectory_printed_once_and_cites_entries(small_store):
    text = serialize_working_memory([small_store.unit("u3"), small_store.unit("u4")], small_store)
    assert text.splitlines() == [
        "[M1] Melanie works as a nurse at the city hospital (Melanie; turn 8) Trajectory: origin: this entry "
        "-> update, current: [M2].",
        "[M2] Melanie now works as a pottery teacher (Melanie; turn 20) Trajectory: see [M1].",
    ]
