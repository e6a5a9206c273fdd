"""PromptEncoder: the graph slot, memory trimming, answer ids, thinking switch, graph-only prompts."""

from __future__ import annotations

import copy

import pytest

from qgmem.prompting import SYSTEM_PROMPT, PromptEncoder, PromptSettings, end_of_turn_id, stop_token_ids


@pytest.mark.parametrize("max_answer_tokens", [1, 3])
def test_answer_truncation_keeps_end_of_turn(smollm2_tokenizer, max_answer_tokens):
    enc = PromptEncoder(smollm2_tokenizer, PromptSettings(max_answer_tokens=max_answer_tokens))
    ids = enc.answer("Bees, three hives of them")
    assert len(ids) == max_answer_tokens and ids[-1] == enc.eot_id


def test_tokenizer_without_chat_template(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = None
    enc = PromptEncoder(tok)
    assert enc.eot_id == tok.eos_token_id and not enc.has_template
    prompt = enc.prompt("[M1] fact", "Question?")
    text = tok.decode(prompt.ids)
    assert text.startswith(tok.bos_token + SYSTEM_PROMPT) and text.endswith("\nAnswer: ")
    assert tok.decode(prompt.ids[prompt.graph_pos:]).startswith("Memory:")


@pytest.mark.parametrize("enable_thinking,empty_think_block", [(False, True), (True, False)])
def test_thinking_switch_reaches_the_template(thinking_tokenizer, enable_thinking, empty_think_block):
    enc = PromptEncoder(thinking_tokenizer, PromptSettings(enable_thinking=enable_thinking))
    text = thinking_tokenizer.decode(enc.prompt("[M1] fact", "Q?").ids)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") is empty_think_block
    assert enc.eot_id == thinking_tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_graph_only_prompt(smollm2_tokenizer):
    enc = PromptEncoder(smollm2_tokenizer, PromptSettings(include_memory_text=False, max_prompt_tokens=100))
    prompt = enc.prompt("[M1] " + "very long memory " * 200, "Where do I live?")
    user = smollm2_tokenizer.decode(prompt.ids[prompt.graph_pos:])
    assert user.startswith("Question: Where do I live?") and "memory" not in user
    assert prompt.memory_tokens_dropped == 0 and prompt.overflow == 0


def test_overflow_counts_a_question_longer_than_the_budget(smollm2_tokenizer):
    enc = PromptEncoder(smollm2_tokenizer, PromptSettings(max_prompt_tokens=100))
    short, long = enc.prompt("[M1] fact", "Where?"), enc.prompt("[M1] fact", "Where? " * 80)
    assert short.overflow == 0 and long.overflow == len(long.ids) - 100 > 0
    assert long.memory_tokens_dropped == len(smollm2_tokenizer("[M1] fact", add_special_tokens=False)["input_ids"])


def test_stop_ids_are_end_of_turn_then_eos(smollm2_tokenizer):
    eot = end_of_turn_id(smollm2_tokenizer)
    assert eot == smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(smollm2_tokenizer)[0] == eot
    assert len(set(stop_token_ids(smollm2_tokenizer))) == len(stop_token_ids(smollm2_tokenizer))
