"""``bench/training/same_figures.py``: two runs' figures compared bit for bit, on hand-written event files."""

from __future__ import annotations

import json
from pathlib import Path

from bench_script import load_bench_script

X = load_bench_script("bench.training.same_figures")


def run(root: Path, nll: list[float], extra: dict[str, float] | None = None, cache_key: str = "k1") -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(root / "lightning_logs" / "version_0"))
    for step, value in enumerate(nll):
        writer.add_scalar("train/nll_step", value, step)
    for tag, value in (extra or {}).items():
        writer.add_scalar(tag, value, 0)
    writer.close()
    (root / "metrics.json").write_text(json.dumps({"val": {"val/nll": nll[-1]}, "test": {"test/nll": 1.0},
                                                  "data": {"cache_key": cache_key}}))
    return root


def test_the_same_figures_pass_and_any_difference_fails(tmp_path, capsys):
    a = run(tmp_path / "a", [2.5, 2.25])
    assert X.main([str(a), str(run(tmp_path / "b", [2.5, 2.25]))]) == 0
    assert "0 of 4 figures differ" in capsys.readouterr().out
    # one step's loss in its last bit, another cache key, a tag only the second run logs
    assert X.main([str(a), str(run(tmp_path / "c", [2.5, 2.2500002]))]) == 1
    assert "DIFF  scalar train/nll_step" in capsys.readouterr().out
    assert X.main([str(a), str(run(tmp_path / "d", [2.5, 2.25], cache_key="k2"))]) == 1
    added = run(tmp_path / "e", [2.5, 2.25], {"train/loss_step": 3.0})
    assert X.main([str(a), str(added)]) == 1
    assert X.main([str(a), str(added), "--only-in-b", "train/loss_step"]) == 0
    assert "only in b (accepted): scalar train/loss_step" in capsys.readouterr().out
