"""The sentence encoder's batch size on the cache build's own encoder calls: seconds and vector drift.

The build sends the encoder what its embedding memo has not seen, one call at a time (the units of a
dialogue, its source turns, node names, questions ...). This bench replays the first ``--cases``
planned cases of the embedded default once, records every such call (through the same memo, starting
empty), then sends the recorded calls through the encoder again at each ``--batch-sizes`` value,
the sizes taking turns over ``--rounds`` rounds (medians). sentence-transformers sorts a call's texts by
length and pads each batch to its longest text, so a smaller batch pads less. The vectors are
compared with the first size's: the largest absolute difference of any component.

    python -m bench.cache.encoder_batch                         # 12 cases, sizes 128,64,32,16, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


class Recorder:
    """An encoder that remembers the texts of every call and hands them to the real one."""

    def __init__(self, encoder):
        self.encoder, self.dim, self.model_id, self.calls = encoder, encoder.dim, encoder.model_id, []

    def encode(self, texts):
        self.calls.append(list(texts))
        return self.encoder.encode(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", default="data/convomem")
    parser.add_argument("--cases", type=int, default=12)
    parser.add_argument("--batch-sizes", default="128,64,32,16")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import numpy as np
    import torch

    from qgmem.embed import SentenceEncoder
    from qgmem.samples.build import Replayer, plan_cases
    from qgmem.samples.embedding_memo import EmbeddingMemo
    from qgmem.samples.spec import CacheSpec
    from qgmem.training.build_cache import data_module

    preset = data_module(["--config", "default"]).cache_spec  # the embedded default's data settings
    with tempfile.TemporaryDirectory(prefix="qgmem-bench-encoder-") as tmp:
        spec = CacheSpec(data_path=args.data_path, num_cases=preset.num_cases, cache_dir=tmp,
                         distractor_conversations=preset.distractor_conversations,
                         construction=preset.construction, activation=preset.activation)
        plan, _ = plan_cases(spec)
        encoder = SentenceEncoder(max_cache_entries=0)
        recorder = Recorder(encoder)
        replayer = Replayer(spec, EmbeddingMemo(recorder, f"{tmp}/memo"), memo=False)
        for split, case in plan[:args.cases]:
            replayer.rows(split, case)
    calls = [c for c in recorder.calls if c]
    tok = encoder.model.tokenizer
    lengths = [len(ids) for call in calls for ids in tok(call)["input_ids"]]
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    times: dict[int, list[float]] = {s: [] for s in sizes}
    vectors: dict[int, np.ndarray] = {}
    for _ in range(args.rounds):
        for size in sizes:
            encoder.batch_size = size
            t0 = time.perf_counter()
            out = [encoder.encode(call) for call in calls]
            times[size].append(time.perf_counter() - t0)
            vectors[size] = np.concatenate(out)
    first = sizes[0]
    figures = {"cases": min(args.cases, len(plan)), "calls": len(calls), "texts": len(lengths),
               "tokens_p50_p90_max": [int(x) for x in np.percentile(lengths, [50, 90, 100])],
               "cpu_threads": torch.get_num_threads(), "rounds": args.rounds,
               "seconds": {s: round(statistics.median(t), 2) for s, t in times.items()},
               "speedup_vs_first": {s: round(statistics.median(times[first]) / statistics.median(t), 2)
                                    for s, t in times.items()},
               "max_abs_diff_vs_first": {s: float(np.abs(vectors[s] - vectors[first]).max()) for s in sizes},
               "load_avg_1m": round(os.getloadavg()[0], 2)}
    for key, value in figures.items():
        print(f"{key:>22}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
