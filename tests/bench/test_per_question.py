"""``bench/activation/per_question.py compare --shared``: a swapped-speaker file against the file it was made from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, rows: dict[str, float]) -> Path:
    path.write_text("".join(json.dumps({"question_id": qid, "category": "c", "question": qid, "recall@10": r,
                                        "ndcg@10": r / 2}) + "\n" for qid, r in rows.items()))
    return path


def _compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.activation.per_question", "compare", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_shared_matches_the_swapped_ids(tmp_path):
    plain = _write(tmp_path / "a.jsonl", {"q1": 1.0, "q2": 1.0, "q3": 0.0})
    swapped = _write(tmp_path / "b.jsonl", {"q1/swapped": 0.0, "q3/swapped": 0.0})
    out = _compare("--shared", str(plain), str(swapped))
    assert out.returncode == 0, out.stderr
    assert "2 questions in both files (1 only in A, 0 only in B)" in out.stdout
    assert "| all | 2 | 0.500 | 0.000 |" in out.stdout
    assert "questions whose recall@10 falls: 1; rises: 0" in out.stdout
    # control: without --shared the two files hold different questions, and the script says so
    out = _compare(str(plain), str(swapped))
    assert out.returncode == 2 and "the two files hold different questions" in out.stderr
