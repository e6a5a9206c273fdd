"""The rehearsal of ``configs/qwen3_8b.yaml``: its overrides are exactly the named ones, and it runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qgmem.job import resolved_config
from bench_script import load_bench_script

REPO = Path(__file__).resolve().parents[2]
#: the keys the miniature changes in the preset; anything else differing is a leak of the rehearsal
NAMED_OVERRIDES = sorted([
    "trainer.accelerator", "trainer.devices", "trainer.default_root_dir",
    "model.lm", "model.generation.max_new_tokens",
    "data.data_path", "data.num_cases", "data.cache_dir", "data.sentence_encoder", "data.num_workers",
    "data.construction_llm.base_url", "data.construction_llm.cache_path",
    "data.judge.base_url", "data.judge.cache_path", "data.activation.reranker_path",
])



def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_print_config_differs_from_the_preset_only_in_the_named_overrides(tmp_path):
    R = load_bench_script("bench.rehearsal.paper_preset_rehearsal")
    assert sorted(R.override_keys()) == NAMED_OVERRIDES
    overrides = R.write_overrides(tmp_path, 8123, 12)
    preset = _flat(resolved_config(["--config", "qwen3_8b"], default_config=None))
    rehearsal = _flat(resolved_config(R.config_args(overrides), default_config=None))
    differ = sorted(k for k in set(preset) | set(rehearsal) if preset.get(k) != rehearsal.get(k))
    assert differ == NAMED_OVERRIDES
    # the preset's own values stay: bf16, DDP, gradient checkpointing, LLM construction and judge, LLM reranker
    for key, value in {"trainer.strategy": "ddp", "trainer.max_epochs": 5, "trainer.precision": "bf16-mixed",
                       "model.lm_dtype": "bfloat16",
                       "model.gradient_checkpointing": True, "data.construction.extractor": "llm",
                       "data.answer_filter": "llm", "data.activation.reranker": "llm",
                       "data.construction_llm.backend": "openai", "data.enable_thinking": False}.items():
        assert rehearsal[key] == value, key
    assert rehearsal["data.construction_llm.base_url"] == "http://127.0.0.1:8123/v1"
    assert rehearsal["data.num_cases"] == 12


def test_fill_keeps_the_type_of_a_whole_placeholder():
    R = load_bench_script("bench.rehearsal.paper_preset_rehearsal")
    assert R.fill({"a": "{n}", "b": "{d}/x.sqlite", "c": 3}, {"n": 5, "d": "cache"}) == {"a": 5, "b": "cache/x.sqlite", "c": 3}


@pytest.mark.slow
def test_reduced_rehearsal_runs_the_preset_path_end_to_end(tmp_path):
    """8 cases, one epoch, the random Qwen3 LM behind the LLM server (a quicker model than SmolLM2)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "bench.rehearsal.paper_preset_rehearsal", "--work", str(tmp_path),
                           "--cases", "8", "--epochs", "1", "--server-lm", "random", "--model-share", "32",
                           "--kill-after", "30", "--eval-limit", "2"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    # the sharded build was cut by the server's death, resumed, and equals the 1-process build
    assert r["kill"]["killed_at_requests"] >= 30 and r["kill"]["first_exit"] != 0
    same = r["sharded_vs_single"]
    assert same["same_samples"] and same["sharded"]["duplicates"] == 0 and same["sharded"]["samples"] > 0
    assert same["sharded"]["cases"] == same["single"]["cases"] == 8
    requests = r["server_requests_build"]
    assert requests.get("construction/scripted", 0) > 0 and requests.get("judge/model", 0) > 0
    assert requests.get("construction/model", 0) > 0  # the model's replies went through the same path
    # the 1-process build replays every reply from the response caches, the rejected ones too; only
    # empty replies (an HTTP fault to the backend: retried, never cached) are asked again
    assert r["replay_new_requests_with_content"] == {}
    assert set(r["replay_new_requests"]) <= {"construction/model"}
    t = r["training"]
    assert t["ranks"] == 2 and t["train_disjoint"] and all(all(e["slots"]) for e in t["train_per_epoch"])
    assert all(t["val_batches_per_rank"]) and t["loss_finite"] and t["best_is_min_val_nll"]
    assert t["grad_params"] == ["net"] and t["lm_weights_unchanged"] and t["model_folders_unchanged"]
    assert t["gradient_checkpointing"] == [True, True] and t["layer_calls_per_step"] == [2]
    assert t["metrics_json"] == 1 and t["tensorboard_runs"] == 1 and t["exports"] == 1
    assert t["early_stopping_state"]["patience"] == 2
    assert t["export_config"]["lm"].endswith("qwen3-lm") and t["export_config"]["lm_dtype"] == "bfloat16"
    assert t["export_config"]["enable_thinking"] is False and t["export_config"]["num_graph_tokens"] == 1
    assert t["lm_class"] == "Qwen3ForCausalLM"
    assert r["serve"]["ok"] and r["eval_qa"]["ok"] and r["eval_qa"]["questions"] == 2
