"""GraphTextCollator: label masks, graph slot, truncation, left-padded generation inputs."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from qgmem.prompting import SYSTEM_PROMPT, PromptSettings
from qgmem.training.collate import IGNORE_INDEX, GraphTextCollator


def item(i: int, memory: str, question: str, answer: str, nodes: int = 2) -> dict:
    return {"graph": Data(x=torch.full((nodes, 4), float(i)), edge_index=torch.zeros(2, 0, dtype=torch.long),
                          edge_attr=torch.zeros(0, 4)),
            "memory_text": memory, "question": question, "answer": answer, "category": "user_evidence",
            "qa_id": f"q{i}"}


ITEMS = [item(0, "[M1] The user's sister is called Ana.\n[M2] Ana lives in Lisbon.", "Where does my sister live?",
              "Lisbon"),
         item(1, "[M1] The user keeps bees.", "What do I keep?", "Bees, three hives of them", nodes=3),
         item(2, "", "What is my name?", "I don't know")]


@pytest.mark.parametrize("max_prompt_tokens", [512, 110])
def test_labels_are_exactly_answer_plus_end_of_turn(smollm2_tokenizer, max_prompt_tokens):
    tok = smollm2_tokenizer
    batch = GraphTextCollator(tok, max_prompt_tokens=max_prompt_tokens, max_answer_tokens=32)(ITEMS)
    B, T = batch["input_ids"].shape
    assert B == 3 and batch["labels"].shape == batch["attention_mask"].shape == (B, T)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    assert eot == tok.pad_token_id  # the case where masking by pad id would be wrong
    for b, it in enumerate(ITEMS):
        lab = batch["labels"][b]
        supervised = (lab != IGNORE_INDEX).nonzero().flatten()
        n = int(batch["attention_mask"][b].sum())
        # one contiguous run that ends at the last real token, which is the end-of-turn token
        assert supervised.tolist() == list(range(n - len(supervised), n))
        assert lab[n - 1] == eot and batch["input_ids"][b, n - 1] == eot
        assert tok.decode(lab[supervised[:-1]]) == it["answer"]
        assert torch.equal(lab[supervised], batch["input_ids"][b, supervised])
        assert (batch["attention_mask"][b, n:] == 0).all() and (lab[n:] == IGNORE_INDEX).all()


def test_graph_slot_is_start_of_user_content(smollm2_tokenizer):
    batch = GraphTextCollator(smollm2_tokenizer)(ITEMS)
    for b, it in enumerate(ITEMS):
        pos = int(batch["graph_pos"][b])
        before = smollm2_tokenizer.decode(batch["input_ids"][b, :pos])
        after = smollm2_tokenizer.decode(batch["input_ids"][b, pos:int(batch["attention_mask"][b].sum())])
        assert before.endswith("<|im_start|>user\n") and SYSTEM_PROMPT in before
        assert after.startswith("Memory:\n") and it["question"] in after


def test_truncation_trims_memory_only(smollm2_tokenizer):
    long_memory = "\n".join(f"[M{i}] The user mentioned detail number {i} about the garden." for i in range(1, 60))
    items = [item(0, long_memory, "How many tomato plants do I have?", "Twelve plants")]
    full = GraphTextCollator(smollm2_tokenizer, max_prompt_tokens=4096)(items)
    cut = GraphTextCollator(smollm2_tokenizer, max_prompt_tokens=150)(items)
    n_full, n_cut = int(full["attention_mask"].sum()), int(cut["attention_mask"].sum())
    answer_len = int((cut["labels"] != IGNORE_INDEX).sum())
    assert n_cut - answer_len == 150 < n_full - answer_len
    assert int(cut["memory_tokens_dropped"][0]) == (n_full - n_cut)
    text = smollm2_tokenizer.decode(cut["input_ids"][0, :n_cut])
    assert "[M1] The user mentioned detail number 1 " in text and "[M59]" not in text
    assert "Question: How many tomato plants do I have?" in text and text.endswith("Twelve plants<|im_end|>")


def test_generation_inputs_are_left_padded_prompts(smollm2_tokenizer):
    batch = GraphTextCollator(smollm2_tokenizer)(ITEMS)
    Tg = batch["gen_input_ids"].shape[1]
    for b in range(len(ITEMS)):
        n = int(batch["gen_attention_mask"][b].sum())
        prompt_len = int((batch["labels"][b] == IGNORE_INDEX).logical_and(batch["attention_mask"][b] == 1).sum())
        assert n == prompt_len and (batch["gen_attention_mask"][b, Tg - n:] == 1).all()
        assert torch.equal(batch["gen_input_ids"][b, Tg - n:], batch["input_ids"][b, :n])
        assert int(batch["gen_graph_pos"][b]) == int(batch["graph_pos"][b]) + Tg - n
    assert smollm2_tokenizer.decode(batch["gen_input_ids"][0, -4:]).endswith("<|im_start|>assistant\n")


def test_graphs_and_metadata(smollm2_tokenizer):
    batch = GraphTextCollator(smollm2_tokenizer)(ITEMS)
    assert batch["graph"].num_graphs == 3 and batch["graph"].x.shape == (7, 4)
    assert batch["graph"].batch.tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert batch["qa_id"] == ["q0", "q1", "q2"] and batch["answer"][1] == "Bees, three hives of them"


def test_missing_field_names_the_item(smollm2_tokenizer):
    bad = dict(ITEMS[0])
    del bad["question"]
    with pytest.raises(KeyError, match="item 1 .*'question'"):
        GraphTextCollator(smollm2_tokenizer)([ITEMS[1], bad])


def test_collator_uses_the_given_prompt_settings(smollm2_tokenizer):
    settings = PromptSettings(max_prompt_tokens=4096, include_memory_text=False)
    batch = GraphTextCollator(smollm2_tokenizer, settings)(ITEMS[:1])
    assert batch["input_ids"].shape[0] == 1
    text = smollm2_tokenizer.decode(batch["input_ids"][0])
    assert "Lisbon" in text and "Ana lives" not in text and "Memory:" not in text  # answer kept, memory left out


def test_node_texts_become_word_ids_on_their_graph(smollm2_tokenizer):
    """``node_text`` turns into ``node_word_ids`` on (a copy of) the item's graph, one row per node."""
    items = [dict(ITEMS[0], node_text=["user", "sister Ana"]), dict(ITEMS[1], node_text=["user", "bees", "hives"])]
    batch = GraphTextCollator(smollm2_tokenizer)(items)
    ids = batch["graph"].node_word_ids
    assert ids.shape == (5, 8) and ids.dtype == torch.long
    assert ids[1][ids[1] >= 0].tolist() == smollm2_tokenizer(" sister Ana", add_special_tokens=False)["input_ids"]
    assert not hasattr(ITEMS[0]["graph"], "node_word_ids")  # the dataset's own graph is left as it was
    assert "node_word_ids" not in GraphTextCollator(smollm2_tokenizer)(ITEMS[:2])["graph"]  # no texts, no ids


def test_graphs_alone_equal_the_full_batchs_graph_and_reuse_the_word_pieces(smollm2_tokenizer):
    """``graphs(items)`` (the alignment stage's batches) is the graph of ``collator(items)``, to the
    tensor; the node word pieces are tokenized once per graph, and the collator still pickles."""
    import pickle

    items = [dict(ITEMS[0], node_text=["user", "sister Ana"]), dict(ITEMS[1], node_text=["user", "bees", "hives"])]
    collator = GraphTextCollator(smollm2_tokenizer)
    full, alone = collator(items)["graph"], collator.graphs(items)
    assert set(alone) == {"graph"}
    for key in ("x", "edge_index", "edge_attr", "batch", "node_word_ids"):
        assert torch.equal(alone["graph"][key], full[key]), key
    calls = []
    collator.encoder.tokenizer = lambda *a, **k: calls.append(a) or smollm2_tokenizer(*a, **k)
    collator.graphs(items)
    assert calls == []  # the same graphs again: no tokenization
    collator.graphs([dict(ITEMS[2], node_text=["user", "name"])])
    assert len(calls) == 2  # a new graph: its two node texts
    collator.encoder.tokenizer = smollm2_tokenizer
    assert torch.equal(pickle.loads(pickle.dumps(collator)).graphs(items)["graph"].node_word_ids, full.node_word_ids)
    with pytest.raises(ValueError, match="empty"):
        collator.graphs([])


@pytest.mark.parametrize("m", [0, 1, 2, None])
def test_memory_units_cut_the_text_but_not_the_graph(smollm2_tokenizer, m):
    """``memory_units=m``: the prompt's text holds entries [M1]..[Mm]; the graph keeps every node."""
    tok = smollm2_tokenizer
    memory = "\n".join(f"[M{i}] Fact number {i} about the user." for i in range(1, 11))
    items = [dict(item(0, memory, "Which facts are there?", "Ten", nodes=10))]
    batch = GraphTextCollator(tok, max_prompt_tokens=1024, max_answer_tokens=8, memory_units=m)(items)
    text = tok.decode(batch["input_ids"][0, int(batch["graph_pos"][0]):])  # the user turn (the system turn cites [M1])
    kept = 10 if m is None else m
    assert [f"[M{i}]" in text for i in range(1, 11)] == [i <= kept for i in range(1, 11)]
    assert batch["graph"].num_nodes == 10
    if m == 0:
        assert "(no memory entries)" in text


def test_memory_units_refuses_a_negative_count():
    with pytest.raises(ValueError, match="memory_units"):
        PromptSettings(memory_units=-1)
