"""The answer contract: one object for what an answer depends on, checked once where it is made."""

from __future__ import annotations

import json

import pytest

from qgmem.activation.answer_contract import AnswerContract
from qgmem.activation.config import ActivationConfig
from qgmem.errors import SettingError
from qgmem.prompting import PromptSettings


def test_the_text_budget_is_at_most_the_graph_s_units():
    assert AnswerContract(PromptSettings(memory_units=3), ActivationConfig(k=3)).prompt.memory_units == 3
    with pytest.raises(SettingError, match=r"prompt.memory_units = 4 is more than activation.k = 3"):
        AnswerContract(PromptSettings(memory_units=4), ActivationConfig(k=3))


def test_a_bad_mode_is_refused_by_name():
    with pytest.raises(SettingError, match="field 'graph_mode': .*got 'tokens'"):
        AnswerContract(graph_mode="tokens")


def test_the_contract_is_one_record_that_reads_back_the_same():
    contract = AnswerContract(PromptSettings(memory_units=2, max_prompt_tokens=300, num_graph_tokens=11),
                              ActivationConfig(k=5), "none")
    block = contract.to_dict()
    assert set(block) == {"prompt", "activation", "graph_mode"} and block["prompt"]["memory_units"] == 2
    assert AnswerContract.from_dict(block) == contract
    assert AnswerContract.from_dict(json.loads(json.dumps(block))) == contract  # as a checkpoint or JSON holds it
    assert AnswerContract.from_dict({**block, "graph_mode": "token"}) != contract  # negative control
    # where the graph enters the LM is the network's, not the contract's
    with pytest.raises(SettingError, match="field 'injection' is not part of the answer contract"):
        AnswerContract.from_dict({**block, "injection": "input"})


def test_an_export_config_reads_as_one_contract():
    config = {"answer": {"prompt": {"memory_units": 2, "max_prompt_tokens": 300}, "activation": {"k": 5},
                         "graph_mode": "none"}, "graph_token": {"injection": "kv_prefix"}}
    contract = AnswerContract.from_export_config(config)
    assert contract == AnswerContract(PromptSettings(memory_units=2, max_prompt_tokens=300),
                                      ActivationConfig.from_dict({"k": 5}), "none")
    # an export without the block: the defaults; a block that does not read is named by its field
    assert AnswerContract.from_export_config({}) == AnswerContract()
    with pytest.raises(SettingError, match="field 'answer.prompt' cannot be read by this qgmem"):
        AnswerContract.from_export_config({"answer": {"prompt": {"no_such_setting": 1}}})
    with pytest.raises(SettingError, match=r"answer.prompt.memory_units = 6 is more than answer.activation.k = 5"):
        AnswerContract.from_export_config({"answer": {**config["answer"], "prompt": {"memory_units": 6}}})
