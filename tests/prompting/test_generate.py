"""The one generation helper: ids vs embeddings, left padding, stop tokens, and reading the answer back."""

from __future__ import annotations

import pytest
import torch

from qgmem.prompting import PromptEncoder, PromptSettings, final_answer, generate, left_pad
from qgmem.prompting.generate import AnswerStop, answer_stop, prefix_cache


@pytest.fixture(scope="module")
def tiny_lm(smollm2_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, pad_token_id=smollm2_tokenizer.pad_token_id,
                         eos_token_id=smollm2_tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


PAIRS = [("[M1] The user keeps bees.", "What do I keep?"), ("", "Anything?"),
         ("[M1] a\n[M2] a much longer memory text " * 3, "What?")]


def _prompts(tokenizer):
    enc = PromptEncoder(tokenizer, PromptSettings(max_prompt_tokens=128))
    return enc, [enc.prompt(m, q).ids for m, q in PAIRS]


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_ids_and_embeddings_decode_alike_and_batching_changes_nothing(tiny_lm, smollm2_tokenizer):
    enc, rows = _prompts(smollm2_tokenizer)
    ids, mask = left_pad(rows, enc.pad_id)
    common = {"max_new_tokens": 5, "stop_ids": enc.stop_ids, "pad_id": enc.pad_id}
    from_ids = generate(tiny_lm, smollm2_tokenizer, mask, input_ids=ids, **common)
    embeds = tiny_lm.get_input_embeddings()(ids)
    from_embeds = generate(tiny_lm, smollm2_tokenizer, mask, inputs_embeds=embeds, **common)
    assert from_ids.ids == from_embeds.ids and from_ids.texts == from_embeds.texts
    assert all(1 <= n <= 5 for n in from_ids.num_tokens)
    for b, row in enumerate(rows):
        one_ids, one_mask = left_pad([row], enc.pad_id)
        single = generate(tiny_lm, smollm2_tokenizer, one_mask, input_ids=one_ids, **common)
        assert single.ids[0] == from_ids.ids[b]


def _positions_seen(lm):
    """The sequence length of every forward of ``lm``'s first layer, in order."""
    seen = []
    lm.model.layers[0].register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (args[0] if args else kwargs["hidden_states"]).shape[1]), with_kwargs=True)
    return seen


def test_the_prefix_cache_continues_the_prompt_as_a_full_prefill_does(smollm2_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    lm = LlamaForCausalLM(config).eval()
    enc = PromptEncoder(smollm2_tokenizer, PromptSettings(max_prompt_tokens=128))
    ids, mask = left_pad([enc.prompt("[M1] The user keeps bees.", "What do I keep?").ids], enc.pad_id)
    head = enc.head_ids
    assert ids[0, :len(head)].tolist() == head and len(head) > 10
    embeds = lm.get_input_embeddings()(ids)
    with torch.no_grad():
        full = lm(inputs_embeds=embeds).logits[0, -1]
        cached = lm(inputs_embeds=embeds[:, len(head):], attention_mask=mask,
                    cache=prefix_cache(lm, head)).logits[0, -1]
    assert torch.allclose(full, cached, atol=1e-5)

    seen = _positions_seen(lm)
    common = {"max_new_tokens": 6, "stop_ids": [], "pad_id": enc.pad_id}
    plain = generate(lm, smollm2_tokenizer, mask, inputs_embeds=embeds, **common)
    assert seen[0] == ids.size(1)
    seen.clear()
    for _ in range(2):  # the prefix is never run again: each call prefills only what follows it
        reused = generate(lm, smollm2_tokenizer, mask, inputs_embeds=embeds, prefix_ids=head, **common)
        assert reused.ids == plain.ids and len(plain.ids[0]) == 6
        assert seen[0] == ids.size(1) - len(head) and seen[1:] == [1] * 5
        seen.clear()


def test_padded_rows_prefill_whole_and_equal_rows_share_the_prefix(tiny_lm, smollm2_tokenizer):
    enc, rows = _prompts(smollm2_tokenizer)
    common = {"max_new_tokens": 4, "stop_ids": enc.stop_ids, "pad_id": enc.pad_id, "prefix_ids": enc.head_ids}
    seen = _positions_seen(tiny_lm)
    ids, mask = left_pad(rows, enc.pad_id)
    padded = generate(tiny_lm, smollm2_tokenizer, mask, inputs_embeds=tiny_lm.get_input_embeddings()(ids), **common)
    assert seen[0] == ids.size(1)  # a padded row does not start with the prefix: no cache
    assert padded.ids == generate(tiny_lm, smollm2_tokenizer, mask, input_ids=ids,
                                  **{**common, "prefix_ids": ()}).ids
    seen.clear()
    ids, mask = left_pad([rows[0], rows[0]], enc.pad_id)
    twice = generate(tiny_lm, smollm2_tokenizer, mask, inputs_embeds=tiny_lm.get_input_embeddings()(ids),
                     **{**common, "stop_ids": []})
    # the prefix's own forward (once for this LM), then the rest of the prompt and one position a step
    assert seen == [len(enc.head_ids), ids.size(1) - len(enc.head_ids), 1, 1, 1]
    one_ids, one_mask = left_pad([rows[0]], enc.pad_id)
    alone = generate(tiny_lm, smollm2_tokenizer, one_mask, input_ids=one_ids, **{**common, "stop_ids": [],
                                                                                   "prefix_ids": ()})
    assert twice.ids == alone.ids * 2 and len(alone.ids[0]) == 4


def test_generate_needs_exactly_one_input(tiny_lm, smollm2_tokenizer):
    mask = torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="exactly one"):
        generate(tiny_lm, smollm2_tokenizer, mask, max_new_tokens=1, stop_ids=[0], pad_id=0)


class ScriptedLM(torch.nn.Module):
    """Replies with fixed token rows, to check how the helper cuts and decodes them."""

    def __init__(self, rows):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.rows = torch.tensor(rows)
        self.kwargs = {}

    def generate(self, **kwargs):
        self.kwargs = kwargs
        return self.rows


def test_rows_are_cut_after_the_first_stop_token(smollm2_tokenizer):
    tok = smollm2_tokenizer
    a, b = tok("Green", add_special_tokens=False)["input_ids"], tok("Blue sky", add_special_tokens=False)["input_ids"]
    eot, pad = tok.convert_tokens_to_ids("<|im_end|>"), 7
    width = max(len(a), len(b)) + 3
    rows = [a + [eot] + [a[0]] * (width - len(a) - 1), b + [pad] * (width - len(b))]
    lm = ScriptedLM(rows)
    out = generate(lm, tok, torch.ones(2, 1, dtype=torch.long), inputs_embeds=torch.zeros(2, 1, 4), max_new_tokens=width,
                   stop_ids=[eot], pad_id=pad, stop_at_newline=True)
    assert out.ids[0] == a + [eot] and out.texts[0] == "Green"
    assert out.ids[1] == rows[1] and out.texts[1].startswith("Blue sky")  # no stop token: the whole row
    [criterion] = lm.kwargs["stopping_criteria"]
    assert lm.kwargs["do_sample"] is False and isinstance(criterion, AnswerStop) and criterion.start == 0
    assert lm.kwargs["eos_token_id"] == [eot] and lm.kwargs["pad_token_id"] == pad
    generate(lm, tok, torch.ones(2, 1, dtype=torch.long), inputs_embeds=torch.zeros(2, 1, 4), max_new_tokens=width,
             stop_ids=[eot], pad_id=pad, stop_at_newline=True)
    # the vocabulary's line-break tokens are found once per tokenizer, not once per call
    assert lm.kwargs["stopping_criteria"][0].newlines is criterion.newlines
    generate(lm, tok, torch.ones(2, 3, dtype=torch.long), input_ids=torch.zeros(2, 3, dtype=torch.long),
             max_new_tokens=width, stop_ids=[eot], pad_id=pad, stop_at_newline=True)
    assert lm.kwargs["stopping_criteria"][0].start == 3  # from ids, the prompt is not part of the reply


def _stops(tok, replies, start=0, prompt=()):
    """What the answer criterion says after the last token of each reply (each reply its own batch row)."""
    rows = [list(prompt) + tok(r, add_special_tokens=False)["input_ids"] for r in replies]
    stop = answer_stop(tok, start)
    return [bool(stop(torch.tensor([row]), None)[0]) for row in rows]


def test_the_answer_criterion_stops_after_an_answer_line_not_after_a_lead_in(smollm2_tokenizer):
    """The issue's shape: "The answer is:" and a line break. The plain first-line stop ended the reply there
    and the answer was lost; the criterion lets the row go on to the answer and ends it after that line."""
    tok = smollm2_tokenizer
    assert _stops(tok, ["The answer is:\n", "Answer:\n\n", "The answer is\n", "Green.\n", "The answer is:\nGreen.\n",
                        "[M5] Books have such an awesome power. (Caroline; turn 98)\n", "Green"]) == \
        [False, False, False, True, True, True, False]
    prompt = tok("Question: what colour?\n", add_special_tokens=False)["input_ids"]
    # the prompt's own complete line is not a reply line: only what follows ``start`` is read
    assert _stops(tok, ["The answer is:\n"], start=len(prompt), prompt=prompt) == [False]
    assert _stops(tok, ["The answer is:\n"], start=0, prompt=prompt) == [True]  # a negative control of ``start``


@pytest.mark.parametrize("text,first_line,expected", [
    ("  Green.\nAnd then more.", True, "Green."),
    ("\n\nGreen.\nMore", True, "Green."),
    ("Green.\nMore", False, "Green.\nMore"),
    ("<think>\nthe user said green\n</think>\n\nGreen.", True, "Green."),
    ("<think>unfinished", True, ""),
    ("", True, ""),
])
def test_final_answer(text, first_line, expected):
    assert final_answer(text, first_line) == expected


def test_a_row_ended_by_its_line_break_counts_no_padding_after_it(smollm2_tokenizer):
    """In a batch, a row the line-break criterion ended is padded while others decode on; when the pad is a
    stop token (SmolLM2: ``<|im_end|>``), it is not a generated token: the row counts as it would alone."""
    tok = smollm2_tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    short = tok("Green.\n", add_special_tokens=False)["input_ids"]
    long = tok("Blue sky over the sea", add_special_tokens=False)["input_ids"]
    width = max(len(short), len(long)) + 1
    rows = [short + [eot] * (width - len(short)), long + [tok("!", add_special_tokens=False)["input_ids"][0]]]
    rows[1] = rows[1] + [eot] * (width - len(rows[1]))
    lm = ScriptedLM(rows)
    out = generate(lm, tok, torch.ones(2, 1, dtype=torch.long), inputs_embeds=torch.zeros(2, 1, 4), max_new_tokens=width,
                   stop_ids=[eot], pad_id=eot, stop_at_newline=True)
    assert out.ids[0] == short and out.texts[0] == "Green.\n"
    assert out.ids[1] == long + rows[1][len(long):len(long) + 2]  # a real end of turn is a generated token
