from __future__ import annotations

import json

import numpy as np
import pytest

from qgmem.cli import main
from qgmem.llm.base import LLMConfig
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.build_cli import dialogue_folder
from qgmem.memory.store import MemoryStore

from llm.helpers import StubServer, completion  # tests/llm, importable as "llm" under pytest
from .helpers import BagOfWordsEncoder
from .test_builder import _recorded


@pytest.fixture()
def fake_encoder(monkeypatch):
    import qgmem.embed

    monkeypatch.setattr(qgmem.embed, "SentenceEncoder", lambda *a, **k: BagOfWordsEncoder())


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_heuristic_build_on_convomem_sample_then_resume(tmp_path, convomem_path, capsys, fake_encoder):
    args = ["build-memory", "--dataset", "convomem", "--path", str(convomem_path), "--out", str(tmp_path),
            "--limit", "2", "--json"]
    assert main(args) == 0
    summary = _last_json(capsys)
    assert summary["dialogues"] == 2 and summary["reused_dialogues"] == 0 and summary["units"] > 50
    assert 0.2 <= summary["windows"] / summary["turns"] <= 0.3 and summary["llm_calls"] == 0
    index = [json.loads(line) for line in (tmp_path / "index.jsonl").read_text().splitlines()]
    store = MemoryStore.load(tmp_path / index[0]["folder"])
    assert index[0]["folder"] == f"stores/{dialogue_folder(store.dialogue_id)}"
    assert len(store.units) == index[0]["units"] and store.embeddings.shape == (len(store.units), 512)
    assert main(args) == 0
    again = _last_json(capsys)
    assert again["reused_dialogues"] == 2 and again["units"] == summary["units"]
    # every sentence is accounted for: each read one is a unit (ConvoMem shares no images), a fallback
    # unit stands for one or more fallback sentences of its turn, and the rest say why they gave none
    sentences = summary["sentences"]
    read = sum(n for key, n in sentences.items() if key.endswith("/read"))
    fallback = sum(n for key, n in sentences.items() if key.endswith("/fallback"))
    assert read <= summary["units"] <= read + fallback
    assert fallback > 0  # ConvoMem has turns no rule reads
    assert {"user/read", "assistant/read", "user/question"} <= set(sentences)
    assert again["sentences"] == sentences  # reused stores keep their counts


def _flip_middle(path, n=32):
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_and_half_written_stores_are_rebuilt_not_reused(tmp_path, convomem_path, capsys, fake_encoder):
    args = ["build-memory", "--dataset", "convomem", "--path", str(convomem_path), "--out", str(tmp_path),
            "--limit", "3", "--json", "--extractor", "heuristic"]
    assert main(args) == 0
    first = _last_json(capsys)
    index = [json.loads(line) for line in (tmp_path / "index.jsonl").read_text().splitlines()]
    folders = [tmp_path / row["folder"] for row in index]
    good = MemoryStore.load(folders[0]).embeddings
    _flip_middle(folders[0] / "embeddings.safetensors")  # flipped bytes
    units = folders[1] / "units.jsonl"
    units.write_bytes(units.read_bytes()[:100])  # truncated
    stale = tmp_path / "stores" / f".{folders[2].name}.tmp-999999999"  # a killed build's leftovers
    stale.mkdir()
    (stale / "units.jsonl").write_text("{")
    assert main(args) == 0
    captured = capsys.readouterr()
    again = json.loads(captured.out.strip().splitlines()[-1])
    assert again["reused_dialogues"] == 1 and again["rebuilt_corrupt"] == 2 and again["removed_temp"] == 1
    assert "embeddings.safetensors: checksum mismatch" in again["rebuilt_corrupt_examples"][0]
    assert "units.jsonl: truncated" in again["rebuilt_corrupt_examples"][1]
    assert "rebuilt 2 stores that failed their integrity check" in captured.out and not stale.exists()
    np.testing.assert_array_equal(MemoryStore.load(folders[0]).embeddings, good)
    assert again["units"] == first["units"]


def test_llm_build_through_a_flaky_http_server(tmp_path, convomem_path, capsys, fake_encoder):
    seen = []

    def respond(request):
        seen.append(200)
        if len(seen) % 7 == 3:
            seen[-1] = 429
            return 429, "slow down"
        if any("Friday" in m["content"] for m in request["messages"]):  # this window never validates
            return completion("Sorry, I can't produce JSON today.")
        return completion(_recorded(request["messages"]), 100, 20)

    with StubServer(respond) as server:
        args = ["build-memory", "--dataset", "convomem", "--path", str(convomem_path), "--out", str(tmp_path),
                "--limit", "1", "--extractor", "llm", "--llm-backend", "openai", "--llm-model", "stub",
                "--llm-base-url", server.url, "--llm-concurrency", "2", "--consolidation", "rule", "--json"]
        assert main(args) == 0
        summary = _last_json(capsys)
        requests_first = len(server.requests)
        assert main([*args, "--no-resume"]) == 0
        replay = _last_json(capsys)
        requests_replay = len(server.requests) - requests_first
        assert main([*args, "--no-resume", "--refresh-llm-cache", "rejected"]) == 0
        refreshed = _last_json(capsys)
    assert summary["skipped_windows"] >= 1 and summary["skip_reasons"] == {"invalid_reply": summary["skipped_windows"]}
    assert summary["units"] > 0 and summary["llm_requests"] == summary["windows"] + summary["retried_windows"]
    assert summary["llm_requests"] / summary["turns"] <= 0.3 and summary["prompt_tokens"] > 0
    # at temperature 0 the rerun replays everything, the invalid replies too (rejected again): no request
    assert replay["units"] == summary["units"] and replay["llm_calls"] == 0 and requests_replay == 0
    assert replay["llm_cache_hits"] == summary["llm_requests"] and replay["skip_reasons"] == summary["skip_reasons"]
    # --refresh-llm-cache rejected asks exactly the invalid ones again (prompt + retry prompt)
    assert refreshed["llm_calls"] == 2 * summary["skipped_windows"] and refreshed["units"] == summary["units"]


def test_duplicate_sample_ids_stop_the_build_or_are_counted(tmp_path, capsys, fake_encoder):
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[1] / "fixtures" / "locomo_small.json").read_text(encoding="utf-8"))
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps([doc[0], doc[0]]), encoding="utf-8")
    args = ["build-memory", "--dataset", "locomo", "--path", str(twice), "--out", str(tmp_path / "out"), "--json",
            "--extractor", "heuristic"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"item 1, field sample_id: duplicate sample_id {doc[0]['sample_id']!r}: already used at file " \
           "twice.json, item 0" in err and "Traceback" not in err
    assert main([*args, "--lenient"]) == 0
    captured = capsys.readouterr().out
    summary = json.loads(captured.strip().splitlines()[-1])
    assert summary["dialogues"] == 1 and summary["load_skipped"] == 1 and "skipped 1 bad records" in captured


def test_long_turn_is_cut_with_a_counted_warning(tmp_path, capsys, fake_encoder):
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[1] / "fixtures" / "locomo_small.json").read_text(encoding="utf-8"))
    doc[0]["conversation"]["session_1"][0]["text"] = "I moved to Lisbon last spring. " * 40_000  # ~1.2 MB
    path = tmp_path / "long.json"
    path.write_text(json.dumps(doc[:1]), encoding="utf-8")
    args = ["build-memory", "--dataset", "locomo", "--path", str(path), "--out", str(tmp_path / "out"), "--json",
            "--max-turn-chars", "2000", "--extractor", "heuristic"]
    assert main(args) == 0
    captured = capsys.readouterr().out
    summary = json.loads(captured.strip().splitlines()[-1])
    assert summary["load_truncated_turns"] == 1 and "1 turns cut at --max-turn-chars 2000" in captured
    store = MemoryStore.load(tmp_path / "out" / json.loads((tmp_path / "out" / "index.jsonl").read_text())["folder"])
    assert max(len(u.source_text) for u in store.units) <= 2000 and max(len(u.fact) for u in store.units) <= 2000


def test_refresh_llm_cache_asks_the_dropped_replies_again(tmp_path, convomem_path, capsys, fake_encoder):
    with StubServer(lambda request: completion(_recorded(request["messages"]), 100, 20)) as server:
        args = ["build-memory", "--dataset", "convomem", "--path", str(convomem_path), "--out", str(tmp_path),
                "--limit", "1", "--extractor", "llm", "--llm-backend", "openai", "--llm-model", "stub",
                "--llm-base-url", server.url, "--consolidation", "rule", "--json", "--no-resume"]
        assert main(args) == 0
        first = _last_json(capsys)
        assert main(args) == 0
        cached = _last_json(capsys)
        assert main([*args, "--refresh-llm-cache", "all"]) == 0
        captured = capsys.readouterr()
        refreshed = json.loads(captured.out.strip().splitlines()[-1])
        assert main([*args, "--refresh-llm-cache", "nonsense!"]) == 2
        bad = capsys.readouterr().err
    assert first["llm_calls"] == first["llm_requests"] > 0
    assert cached["llm_calls"] == 0 and cached["llm_cache_hits"] == first["llm_requests"]
    assert refreshed["llm_calls"] == first["llm_requests"] and refreshed["units"] == first["units"]
    assert f"dropped {first['llm_requests']} cached LLM replies (all)" in captured.err
    assert "--refresh-llm-cache 'nonsense!': expected all, rejected, a hex key prefix" in bad and "Traceback" not in bad


# --- an LLM outage is never saved as a finished store; failed windows are asked again on resume -------

def _llm_args(server_url, convomem_path, out, *extra, deadline="30"):
    """``deadline`` 0.5 s for a failing server: one attempt, no backoff wait (the backoff would pass it)."""
    return ["build-memory", "--dataset", "convomem", "--path", str(convomem_path), "--out", str(out), "--limit", "1",
            "--extractor", "llm", "--llm-backend", "openai", "--llm-model", "stub", "--llm-base-url", server_url,
            "--consolidation", "rule", "--llm-deadline", deadline, "--json", *extra]


@pytest.mark.parametrize("outage", [(401, "unauthorized"), (500, "server error"), completion("")],
                         ids=["401", "500", "empty"])
def test_an_outage_stops_the_build_and_a_later_run_recovers(tmp_path, convomem_path, capsys, fake_encoder, outage):
    with StubServer(lambda request: outage) as down:
        assert main(_llm_args(down.url, convomem_path, tmp_path, deadline="0.5")) == 2  # was: rc 0, "units 0, skipped 2"
    err = capsys.readouterr().err
    assert "windows got no usable LLM reply (llm_error " in err and "no store was saved for it" in err
    assert "Traceback" not in err
    assert not list((tmp_path / "stores").glob("*/meta.json"))  # nothing that looks finished
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped"].startswith("dialogue ") and summary["skipped_windows"] == summary["windows"] > 0
    with StubServer(lambda request: completion(_recorded(request["messages"]))) as healthy:
        assert main(_llm_args(healthy.url, convomem_path, tmp_path)) == 0  # resume: no --no-resume needed
    after = _last_json(capsys)
    assert after["reused_dialogues"] == 0 and after["units"] > 0 and after["skipped_windows"] == 0


def _failing_on_friday(status: int, body: str):
    """A server that answers ``status`` to every window mentioning Friday and the recorded reply otherwise."""
    def handler(request):
        if any("Friday" in m["content"] for m in request["messages"]):
            return status, body
        return completion(_recorded(request["messages"]))

    return handler


def test_failed_windows_under_the_threshold_are_asked_again_on_resume(tmp_path, convomem_path, capsys, fake_encoder):
    flaky = _failing_on_friday(500, "down for this one")

    with StubServer(flaky) as server:
        assert main(_llm_args(server.url, convomem_path, tmp_path, deadline="0.5")) == 0
    first = _last_json(capsys)
    assert 0 < first["skipped_windows"] < first["windows"] / 2 and first["skip_reasons"] == {
        "llm_error": first["skipped_windows"]}
    with StubServer(lambda request: completion(_recorded(request["messages"]))) as healthy:
        assert main(_llm_args(healthy.url, convomem_path, tmp_path)) == 0
    second = _last_json(capsys)
    assert second["retried_failed_windows_stores"] == 1 and second["reused_dialogues"] == 0
    assert second["skipped_windows"] == 0 and second["units"] > first["units"]
    # the good replies came from the cache: only the failed windows reached the server
    assert len(healthy.requests) == second["llm_calls"] == first["skipped_windows"]


def test_max_failed_windows_zero_stops_at_one_failed_window(tmp_path, convomem_path, capsys, fake_encoder):
    flaky = _failing_on_friday(401, "no")

    with StubServer(flaky) as server:
        assert main(_llm_args(server.url, convomem_path, tmp_path, "--max-failed-windows", "0")) == 2
        assert "more than the allowed share 0;" in capsys.readouterr().err
        assert main(_llm_args(server.url, convomem_path, tmp_path, "--max-failed-windows", "1.5")) == 2
        assert "max_failed_share must be in [0, 1]" in capsys.readouterr().err


def test_the_api_key_is_in_no_summary_and_no_output(tmp_path, convomem_path, capsys, fake_encoder, monkeypatch):
    key = "sk-live-0123456789SECRETKEY"
    monkeypatch.setenv("QGMEM_TEST_KEY", key)
    holder = {}

    def echo(request):  # a proxy that echoes the request headers in its 401 body
        return 401, json.dumps({"error": "bad key", "headers": holder["server"].headers[-1], "key": key})

    with StubServer(echo) as server:
        holder["server"] = server
        assert main(_llm_args(server.url, convomem_path, tmp_path, "--llm-api-key-env", "QGMEM_TEST_KEY",
                              deadline="0.5")) == 2
    assert server.headers[0]["Authorization"] == f"Bearer {key}"
    captured = capsys.readouterr()
    written = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*.json*"))
    assert "HTTP 401" in captured.err + written
    for text in (captured.out, captured.err, written):
        assert key not in text and key[:10] not in text


def test_flag_defaults_are_the_dataclass_defaults(tmp_path):
    """build-memory's settings default to ``ConstructionConfig``'s and ``LLMConfig``'s fields, written nowhere else."""
    from qgmem.memory.build_cli import BuildMemorySettings

    settings = BuildMemorySettings(dataset="locomo", path="p", out=str(tmp_path))
    assert settings.construction() == ConstructionConfig()
    assert settings.llm(tmp_path) == LLMConfig(cache_path=str(tmp_path / "llm_cache.sqlite"))


def test_flags_reach_the_configs(monkeypatch, tmp_path, convomem_path, fake_encoder):
    """What the flags say is what the build's ``ConstructionConfig`` and ``LLMConfig`` hold."""
    import qgmem.llm.backends
    import qgmem.memory.builder
    from qgmem.errors import command_parser
    from qgmem.memory import build_cli

    seen = {}

    class Stop(Exception):
        pass

    def builder(config, encoder, llm=None, max_failed_share=None):
        seen["construction"] = config
        raise Stop

    monkeypatch.setattr(qgmem.llm.backends, "make_backend", lambda config: seen.setdefault("llm", config))
    monkeypatch.setattr(qgmem.memory.builder, "MemoryBuilder", builder)
    parser = command_parser("qgmem build-memory", "", build_cli.add_arguments)
    args = parser.parse_args(["--dataset", "convomem", "--path", str(convomem_path), "--out", str(tmp_path),
                              "--extractor", "llm", "--window-size", "5", "--window-overlap", "1",
                              "--llm-timeout", "7", "--llm-concurrency", "3", "--llm-model", "m"])
    with pytest.raises(Stop):
        build_cli.run(args)
    construction, llm = seen["construction"], seen["llm"]
    assert (construction.extractor, construction.window_size, construction.window_overlap) == ("llm", 5, 1)
    assert construction.consolidation == ConstructionConfig().consolidation
    assert (llm.timeout_s, llm.max_concurrency, llm.model) == (7.0, 3, "m")
    assert llm.cache_path == str(tmp_path / "llm_cache.sqlite") and llm.deadline_s == LLMConfig().deadline_s
