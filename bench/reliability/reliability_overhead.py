"""What the second round of reliability checks costs, each beside the stage it sits in, in one run.

Timed side by side (interleaved repeats, medians):

- export write (``save_pretrained``) and the ``checksums.json`` it now seals;
- export load (``GraphTokenEncoder.load_folder``) with and without the checksum + finiteness checks,
  against the whole serving load (``QGMemPipeline.from_pretrained``: encoder, sentence encoder, LM);
- store load through the build's index with the store lock (``load_built_store``) against the bare
  verified load without lock or index;
- the answer path (``pipeline.answer``) on that store, against which the store-load overhead is set;
- data loading (``load_cases`` on ``data/convomem``) with the per-record accounting
  (``LoadContext.record``) and with it replaced by a no-op.

The export is randomly initialised with the default preset's shapes (MiniLM features, SmolLM2 LM,
``node_words`` features, ``nodes`` readout, K = 16), so the weights have the default's size.

    python -m bench.reliability.reliability_overhead --repeats 20 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, the functions taking turns so load changes hit all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def default_shaped_export(folder: Path):
    from qgmem.activation.config import ActivationConfig
    from qgmem.lm import EMBEDDED_LM
    from qgmem.memory.config import ConstructionConfig
    from qgmem.model.encoder import EncoderConfig
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.model.pretrained import GraphTokenEncoder
    from qgmem.prompting import PromptSettings

    config = GraphTokenConfig(feature_dim=384, edge_dim=384, lm_hidden=576, features="node_words", readout="nodes",
                              num_graph_tokens=16, encoder=EncoderConfig(hidden=256, heads=4, layers=2, dropout=0.0))
    export = {"lm": {"id": EMBEDDED_LM, "hidden_size": 576, "load_dtype": "auto"},
              "prompt": PromptSettings().to_dict(),
              "sentence_encoder": {"id": "embedded:all-MiniLM-L6-v2", "dim": 384},
              "construction": ConstructionConfig().to_dict(), "activation": ActivationConfig().to_dict(),
              "generation": {"max_new_tokens": 4}}
    return GraphTokenEncoder(config, export).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--data", default="data/convomem")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file

    import qgmem.model.pretrained as pretrained
    from qgmem.data import _common
    from qgmem.data.loaders import load_cases
    from qgmem.finite import nonfinite_names
    from qgmem.integrity import seal, verify_sealed
    from qgmem.memory.build_cli import dialogue_folder
    from qgmem.memory.output import load_built_store, write_index
    from qgmem.memory.store import MemoryStore
    from qgmem.serving.pipeline import QGMemPipeline

    torch.set_num_threads(1)
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        encoder = default_shaped_export(tmp)
        folder = tmp / "export"
        write = median_time(lambda: encoder.save_pretrained(folder), max(3, args.repeats // 4))
        weights = folder / pretrained.WEIGHTS_FILE
        sealing = median_time(lambda: seal(folder, [pretrained.WEIGHTS_FILE]), args.repeats)
        out["export_write"] = {"weights_mib": round(weights.stat().st_size / 2**20, 2), "save_pretrained_s": write,
                               "seal_s": sealing, "ratio": sealing / write}

        def load_unchecked():  # the load as it was: no checksums, no finiteness check
            saved = pretrained.verify_sealed, pretrained.nonfinite_names
            pretrained.verify_sealed = lambda *a, **k: None
            pretrained.nonfinite_names = lambda state: []
            try:
                pretrained.GraphTokenEncoder.load_folder(folder)
            finally:
                pretrained.verify_sealed, pretrained.nonfinite_names = saved

        loads = interleaved({"checked": lambda: pretrained.GraphTokenEncoder.load_folder(folder),
                             "unchecked": load_unchecked}, args.repeats)
        state = load_file(str(weights))
        checks = interleaved({"verify_sealed": lambda: verify_sealed(folder),
                              "nonfinite_names": lambda: nonfinite_names(state)}, args.repeats)
        t0 = time.perf_counter()
        pipe = QGMemPipeline.from_pretrained(folder, device="cpu", max_new_tokens=4)
        serving_load = time.perf_counter() - t0
        added = checks["verify_sealed"] + checks["nonfinite_names"]
        out["export_load"] = {"load_folder_checked_s": loads["checked"], "load_folder_unchecked_s": loads["unchecked"],
                              **{f"{k}_s": v for k, v in checks.items()}, "serving_load_s": serving_load,
                              "checks_over_serving_load": added / serving_load}

        # a store built from one ConvoMem history, saved as build-memory lays it out
        from qgmem.serving.history_file import load_history

        history = next((Path(args.data) / "core_benchmark" / "evidence_questions" / "user_evidence").rglob("*.json"))
        case = load_history(history)
        store = pipe.remember(case)
        build_out = tmp / "out"
        store_dir = build_out / "stores" / dialogue_folder(store.dialogue_id)
        store.save(store_dir)
        write_index(build_out, [{"dialogue_id": store.dialogue_id, "folder": f"stores/{store_dir.name}",
                                 "units": len(store), "traces": len(store.traces)}])
        stores = interleaved({"index_and_lock": lambda: load_built_store(build_out, store.dialogue_id),
                              "bare": lambda: MemoryStore._load(store_dir, None, True, True)}, args.repeats)
        pipe.load_memory(build_out, store.dialogue_id)
        questions = [qa.question for qa in case.qas[:2]] or ["What did I say?"]
        pipe.answer(questions[:1])  # warm-up (first call builds the activation index)
        t0 = time.perf_counter()
        answers = pipe.answer(questions)
        per_question = (time.perf_counter() - t0) / len(answers)
        extra = stores["index_and_lock"] - stores["bare"]
        out["store_and_answer"] = {"units": len(store), "store_load_index_and_lock_s": stores["index_and_lock"],
                                   "store_load_bare_s": stores["bare"], "added_s": extra,
                                   "answer_s_per_question": per_question,
                                   "added_over_answer": extra / per_question}

        # data loading: ConvoMem (what python train.py loads) with the blank-text check and with plain ``need``;
        # LoCoMo (200 samples made from the fixture) with the per-record accounting on and off
        from qgmem.data import convomem

        def convomem_without_blank_check():
            convomem.need_text = _common.need
            try:
                load_cases("convomem", args.data)
            finally:
                convomem.need_text = _common.need_text

        data = interleaved({"convomem_s": lambda: load_cases("convomem", args.data),
                            "convomem_without_blank_check_s": convomem_without_blank_check}, max(3, args.repeats // 4))
        fixture = json.loads((REPO / "tests" / "fixtures" / "locomo_small.json")
                             .read_text(encoding="utf-8"))
        samples = [{**fixture[i % len(fixture)], "sample_id": f"s{i}"} for i in range(200)]
        locomo_file = tmp / "locomo.json"
        locomo_file.write_text(json.dumps(samples), encoding="utf-8")
        original = _common.LoadContext.record

        def locomo_without_record():
            _common.LoadContext.record = lambda self: contextlib.nullcontext()
            try:
                load_cases("locomo", locomo_file)
            finally:
                _common.LoadContext.record = original

        data.update(interleaved({"locomo_s": lambda: load_cases("locomo", locomo_file),
                                 "locomo_without_record_s": locomo_without_record}, args.repeats))
        data["convomem_ratio"] = data["convomem_s"] / data["convomem_without_blank_check_s"] - 1.0
        data["locomo_ratio"] = data["locomo_s"] / data["locomo_without_record_s"] - 1.0
        out["data_loading"] = data
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for section, values in out.items():
            print(section, ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items()))


if __name__ == "__main__":
    sys.exit(main())
