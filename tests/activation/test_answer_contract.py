"""The answer contract: one object for what an answer depends on, checked once where it is made."""

from __future__ import annotations

import pytest

from qgmem.activation.answer_contract import AnswerContract
from qgmem.activation.config import ActivationConfig
from qgmem.errors import SettingError
from qgmem.prompting import PromptSettings


def test_the_text_budget_is_at_most_the_graph_s_units():
    assert AnswerContract(PromptSettings(memory_units=3), ActivationConfig(k=3)).prompt.memory_units == 3
    with pytest.raises(SettingError, match=r"prompt.memory_units = 4 is more than activation.k = 3"):
        AnswerContract(PromptSettings(memory_units=4), ActivationConfig(k=3))


@pytest.mark.parametrize("field,value,message", [
    ("graph_mode", "tokens", "field 'graph_mode': graph_mode must be one of token, none, shuffled, got 'tokens'"),
    ("injection", "prefix", "injection must be one of input, kv_prefix, got 'prefix'")])
def test_a_bad_mode_is_refused_by_name(field, value, message):
    with pytest.raises(SettingError, match=message):
        AnswerContract(**{field: value})


def test_an_export_config_reads_as_one_contract():
    config = {"prompt": {"memory_units": 2, "max_prompt_tokens": 300}, "activation": {"k": 5},
              "graph_mode": "none", "graph_token": {"injection": "kv_prefix"}}
    contract = AnswerContract.from_export_config(config)
    assert contract == AnswerContract(PromptSettings(memory_units=2, max_prompt_tokens=300),
                                      ActivationConfig.from_dict({"k": 5}), "none", "kv_prefix")
    # an export written before these fields: the defaults; a block that does not read is named
    assert AnswerContract.from_export_config({}) == AnswerContract()
    with pytest.raises(SettingError, match="field 'prompt' cannot be read by this qgmem"):
        AnswerContract.from_export_config({"prompt": {"no_such_setting": 1}})
    with pytest.raises(SettingError, match=r"prompt.memory_units = 6 is more than activation.k = 5"):
        AnswerContract.from_export_config({**config, "prompt": {"memory_units": 6}})
