"""Text dropout: the training split's text is cut at rate p, the graph and the other splits never."""

from __future__ import annotations

import pytest

from qgmem.errors import SettingError, UserError
from qgmem.evaluation.study_data import InMemoryStudyDataModule as InMemoryDataModule
from qgmem.evaluation.text_dropout import TextDropout

TEXT = "[M1] a\n[M2] b\n[M3] c"


def test_cuts_the_text_at_rate_p_and_keeps_the_graph():
    item = {"memory_text": TEXT, "graph": "G"}
    data = TextDropout([item] * 400, p=0.5, m=1, seed=3)
    seen = [data[i] for i in range(400)]
    cut = [s for s in seen if s["memory_text"] != TEXT]
    assert all(s["memory_text"] == "[M1] a" and s["graph"] == "G" for s in cut)
    assert 150 < len(cut) < 250 and data.dropped == len(cut)
    assert data.share == pytest.approx(len(cut) / 400)


def test_rate_0_never_cuts_and_rate_1_always_cuts():
    item = {"memory_text": TEXT, "graph": "G"}
    never, always = TextDropout([item], p=0.0, m=1), TextDropout([item], p=1.0, m=2)
    assert [never[0]["memory_text"] for _ in range(20)] == [TEXT] * 20
    assert [always[0]["memory_text"] for _ in range(20)] == ["[M1] a\n[M2] b"] * 20
    assert TextDropout([item], p=0.5, m=1).share is None  # nothing read yet


def test_draws_repeat_for_a_seed_and_differ_across_seeds():
    items = [{"memory_text": TEXT, "graph": i} for i in range(200)]

    def cuts(seed):
        data = TextDropout(items, p=0.5, m=1, seed=seed)
        return [data[i]["memory_text"] != TEXT for i in range(200) for _ in range(2)]

    assert cuts(0) == cuts(0) and cuts(0) != cuts(1)


@pytest.mark.parametrize("p, m", [(1.5, 1), (-0.1, 1), (0.5, -1)])
def test_bad_settings_are_user_errors_naming_the_setting(p, m):
    with pytest.raises(SettingError, match="data.text_dropout") as info:
        TextDropout([], p=p, m=m)
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)


def _item(i):
    return {"memory_text": TEXT, "graph": i, "qa_id": str(i)}


def test_data_module_cuts_only_the_training_split():
    train, val = [_item(i) for i in range(50)], [_item(i) for i in range(50, 60)]
    dm = InMemoryDataModule(train, val, val, feature_dim=4, tokenizer=object(), text_dropout=1.0,
                            text_dropout_units=1, order_seed=0)
    dm.setup()
    assert {dm.split("train")[i]["memory_text"] for i in range(50)} == {"[M1] a"}
    assert {dm.split("train")[i]["graph"] for i in range(50)} == set(range(50))
    assert {dm.split(s)[i]["memory_text"] for s in ("val", "test") for i in range(10)} == {TEXT}
    assert dm.prompt_settings.memory_units is None  # the prompt contract (and so the export) is the product's


def test_data_module_without_text_dropout_keeps_the_items():
    train = [_item(i) for i in range(5)]
    dm = InMemoryDataModule(train, feature_dim=4, tokenizer=object())
    dm.setup()
    assert dm.split("train") == train and not isinstance(dm.split("train"), TextDropout)


def test_data_module_refuses_a_bad_rate():
    with pytest.raises(SettingError, match="text_dropout"):
        InMemoryDataModule([_item(0)], feature_dim=4, tokenizer=object(), text_dropout=2.0)


def test_training_loader_uses_the_order_seed_for_its_draws():
    train = [_item(i) for i in range(100)]
    a, b = (InMemoryDataModule(train, feature_dim=4, tokenizer=object(), text_dropout=0.5, order_seed=s)
            for s in (0, 1))
    cut = [[d.split("train")[i]["memory_text"] != TEXT for i in range(100)] for d in (a, b)]
    assert cut[0] != cut[1] and 20 < sum(cut[0]) < 80
