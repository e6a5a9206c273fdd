"""``load_cases`` dispatch and the records' JSON round trip."""

from __future__ import annotations

import json

import pytest

from qgmem.data.loaders import DATASETS, LoadedData, load_cases
from qgmem.data.records import Case


def test_datasets():
    assert DATASETS == ("convomem", "locomo", "longmemeval")


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset 'beam'"):
        load_cases("beam", ".")


def test_unknown_option_is_a_type_error(locomo_file):
    with pytest.raises(TypeError):
        load_cases("locomo", locomo_file, distractor_conversations=3)


@pytest.mark.parametrize(("dataset", "fixture"), [("locomo", "locomo_file"), ("longmemeval", "longmemeval_file"),
                                                  ("convomem", "premixed_root"), ("convomem", "tiny_convomem")])
def test_cases_round_trip_through_json(dataset, fixture, request):
    loaded = load_cases(dataset, request.getfixturevalue(fixture))
    assert isinstance(loaded, LoadedData) and loaded.cases
    json.dumps(loaded.report)  # the report is JSON-ready
    for case in loaded.cases:
        text = json.dumps(case.to_dict(), ensure_ascii=False)
        assert Case.from_dict(json.loads(text)) == case
