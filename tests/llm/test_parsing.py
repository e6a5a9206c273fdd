from __future__ import annotations

import pytest

from qgmem.llm.parsing import JSONExtractionError, extract_json

OBJ = {"units": [{"fact": "a", "n": 1}]}


@pytest.mark.parametrize("reply", [
    '{"units": [{"fact": "a", "n": 1}]}',
    '```json\n{"units": [{"fact": "a", "n": 1}]}\n```',
    '<think>The user wants {json}. Let me think {"units": []}</think>\n{"units": [{"fact": "a", "n": 1}]}',
    'Sure! Here is the JSON:\n{"units": [{"fact": "a", "n": 1}]}\nLet me know if you need more.',
    '{"units": [{"fact": "a", "n": 1}]} {"units": []}',
    'Broken first {"units": [} then ```\n{"units": [{"fact": "a", "n": 1}]}\n```',
])
def test_extracts_the_object_despite_decoration(reply):
    assert extract_json(reply) == OBJ


@pytest.mark.parametrize("reply,message", [
    ("", "empty"), ("<think>still thinking {\"units\": []}", "empty"), ("no json here", "no JSON object"),
    ('{"units": [1, 2', "invalid JSON"), ("[1, 2]", "no JSON object"),
])
def test_failures_say_why(reply, message):
    with pytest.raises(JSONExtractionError, match=message):
        extract_json(reply)


def test_list_expected():
    assert extract_json("result: [1, 2] done", expect=list) == [1, 2]
