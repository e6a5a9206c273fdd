"""``qgmem data-stats`` through the command line entry point."""

from __future__ import annotations

import json

import pytest

from qgmem.cli import main


def _last_json(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_data_stats_real_convomem(convomem_path, capsys):
    assert main(["data-stats", "--dataset", "convomem", "--path", str(convomem_path), "--json"]) == 0
    out = capsys.readouterr().out
    stats = json.loads(out.strip().splitlines()[-1])
    assert "evidence mapping:" in out and "qas: user_evidence" in out
    assert stats["cases"] == stats["qas"] == 525
    assert stats["qas_per_category"] == {"abstention_evidence": 100, "assistant_facts_evidence": 100,
                                         "changing_evidence": 100, "implicit_connection_evidence": 36,
                                         "preference_evidence": 89, "user_evidence": 100}
    assert sum(s["cases"] for s in stats["splits"].values()) == 525
    assert stats["splits"]["train"]["cases"] > stats["splits"]["val"]["cases"] > 0
    assert stats["split_warnings"]  # one person in the sample: the split falls back to dialogues
    ev = stats["evidence"]
    assert ev["exact"] + ev["contained"] + ev["fuzzy"] + ev["unmatched"] == ev["total"] > 525
    assert stats["sessions"] == 525 * 7 + 100 + 6  # each history: own conversations + 6 distractors


@pytest.mark.parametrize(
    ("dataset", "fixture", "cases", "qas"),
    [("locomo", "locomo_file", 2, 7), ("longmemeval", "longmemeval_file", 2, 2), ("convomem", "premixed_root", 2, 2)],
)
def test_data_stats_fixtures(dataset, fixture, cases, qas, request, capsys):
    path = request.getfixturevalue(fixture)
    assert main(["data-stats", "--dataset", dataset, "--path", str(path), "--json", "--group-key", "dialogue",
                 "--split-ratios", "0.5", "0.5", "0"]) == 0
    stats = _last_json(capsys)
    assert (stats["cases"], stats["qas"]) == (cases, qas)
    assert stats["splits"]["test"]["cases"] == 0 and stats["group_key"] == "dialogue"


def test_data_stats_table_without_json(locomo_file, capsys):
    assert main(["data-stats", "--dataset", "locomo", "--path", str(locomo_file)]) == 0
    out = capsys.readouterr().out
    assert "qas: adversarial" in out and "normalized 3, unmatched 2" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.strip().splitlines()[-1])


def test_data_stats_lenient_reports_skips(tmp_path, locomo_file, capsys):
    doc = json.loads(locomo_file.read_text(encoding="utf-8"))
    del doc[1]["qa"][0]["question"]
    bad = tmp_path / "locomo_bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["data-stats", "--dataset", "locomo", "--path", str(bad), "--json"]) == 2
    assert "item 1, field qa[0].question: missing field" in capsys.readouterr().err
    assert main(["data-stats", "--dataset", "locomo", "--path", str(bad), "--json", "--lenient"]) == 0
    stats = _last_json(capsys)
    assert stats["skipped"] == 1 and stats["cases"] == 1 and "item 1" in stats["skip_reasons"][0]


def test_data_stats_distractor_option(tiny_convomem, capsys):
    assert main(["data-stats", "--dataset", "convomem", "--path", str(tiny_convomem), "--json",
                 "--distractor-conversations", "1"]) == 0
    stats = _last_json(capsys)
    assert stats["sessions"] == 2 * stats["cases"]
    assert "only 2" in stats["split_warnings"][0]  # two persons, three splits: grouped by dialogue
