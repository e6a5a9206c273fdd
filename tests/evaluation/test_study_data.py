"""The studies' data modules: graph-only prompts, an order seed per run, text dropout; the product's cache."""

from __future__ import annotations

import inspect

import pytest

from qgmem.evaluation.study_data import InMemoryStudyDataModule, StudyDataModule
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.synthetic import synthetic_items

STUDY_SETTINGS = {"graph_only", "order_seed", "text_dropout", "text_dropout_units"}


def test_the_study_settings_are_the_studys_and_the_cache_is_the_products(tmp_path):
    assert not STUDY_SETTINGS & set(inspect.signature(QGMemDataModule.__init__).parameters)
    product = QGMemDataModule(cache_dir=str(tmp_path))
    study = StudyDataModule(cache_dir=str(tmp_path), graph_only=True, order_seed=4, text_dropout=0.5)
    assert study.cache_key == product.cache_key and study.dataset_dir == product.dataset_dir
    assert (study.order_seed, product.order_seed) == (4, 0)
    assert StudyDataModule(cache_dir=str(tmp_path), seed=2).order_seed == 2  # unset: the product's, the data seed


@pytest.mark.parametrize("graph_only", [False, True])
def test_graph_only_prompts_carry_no_memory_text(smollm2_tokenizer, graph_only):
    """Graph-only: the collated prompt has neither the memory entries nor the memory header; same answers."""
    from qgmem.prompting import GRAPH_ONLY_SYSTEM_PROMPT, SYSTEM_PROMPT

    items = synthetic_items(2, 4, seed=0)
    dm = InMemoryStudyDataModule(items, tokenizer=smollm2_tokenizer, graph_only=graph_only)
    settings = dm.prompt_settings
    assert settings.include_memory_text is not graph_only
    assert settings.system_prompt == (GRAPH_ONLY_SYSTEM_PROMPT if graph_only else SYSTEM_PROMPT)
    batch = dm.collator(items)
    for b, item in enumerate(items):
        text = smollm2_tokenizer.decode(batch["input_ids"][b])
        assert (item["memory_text"] in text) is not graph_only and ("Memory:" in text) is not graph_only
        assert item["question"] in text and item["answer"] in text


def test_two_order_seeds_give_two_training_orders_on_one_cache(smollm2_tokenizer):
    """The protocol's seeds vary the data order (and the alignment stage's) without a new cache."""
    from qgmem.training.module import _order_seed

    items = synthetic_items(12, 8, seed=0)

    def order(seed):
        dm = InMemoryStudyDataModule(items, tokenizer=smollm2_tokenizer, batch_size=3, order_seed=seed)
        return list(iter(dm.train_dataloader().sampler)), dm

    (a, dm_a), (b, dm_b) = order(0), order(1)
    assert sorted(a) == sorted(b) == list(range(12)) and a != b
    assert order(1)[0] == b  # the same seed, the same order
    assert (_order_seed(dm_a), _order_seed(dm_b), _order_seed(None)) == (0, 1, 0)
    dm_b.order_seed = 5
    assert _order_seed(dm_b) == 5
