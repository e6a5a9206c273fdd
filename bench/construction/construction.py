"""Construction cost on the real ConvoMem sample (data/convomem).

1. Heuristic and parser extractors: turns per second of extraction alone (windows + rules [+ spaCy], no
   encoder), over every dialogue of the sample, and of a full store build (extraction + MiniLM fact embeddings + traces)
   over a few dialogues.
2. LLM extractor: LLM calls and prompt tokens per dialogue turn. Calls and prompt tokens depend only on
   the windowing and the prompts, not on the reply, so a recorded backend that answers every window with
   valid JSON (one unit per new user turn) stands in for the model; prompt tokens are counted with the
   SmolLM2 tokenizer (chat template applied) — the embedded model's own count.

    python -m bench.construction.construction [--path data/convomem] [--dialogues 525] [--build-dialogues 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.common import REPO as ROOT


def recorded_reply(messages) -> str:
    units = []
    for line in messages[1]["content"].splitlines():
        if line.startswith("[T") and "[CONTEXT]" not in line and ": " in line:
            label, text = line[1:line.index("]")], line.split(": ", 1)[1][:80]
            units.append({"fact": text, "turn_start": label, "turn_end": label, "subject": "User",
                          "predicate": "said", "object": text, "entities": [], "location": "", "fact_time": ""})
            break
    return json.dumps({"units": units})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=str(ROOT / "data" / "convomem"))
    parser.add_argument("--dialogues", type=int, default=None, help="dialogues for the heuristic rate (default all)")
    parser.add_argument("--build-dialogues", type=int, default=3, help="dialogues for the full-build rate")
    parser.add_argument("--parser-dialogues", type=int, default=None,
                        help="dialogues for the parser-extraction rate (default all)")
    parser.add_argument("--llm-dialogues", type=int, default=20, help="dialogues for the LLM-path counts")
    args = parser.parse_args()

    from qgmem.data.loaders import load_cases
    from qgmem.memory.builder import MemoryBuilder
    from qgmem.memory.config import ConstructionConfig
    from qgmem.memory.extract_heuristic import HeuristicExtractor
    from qgmem.memory.windows import make_windows

    dialogues = [c.dialogue for c in load_cases("convomem", args.path).cases][: args.dialogues]
    config = ConstructionConfig()
    extractor = HeuristicExtractor(config)
    extractor.extract(make_windows(dialogues[0])[0], dialogues[0].id)  # warm imports and patterns
    turns = units = dated = 0
    started = time.perf_counter()
    for d in dialogues:
        for w in make_windows(d, config.window_size, config.window_overlap):
            out = extractor.extract(w, d.id)
            units += len(out)
            dated += sum(1 for u in out if u.fact_time)
        turns += d.num_turns()
    seconds = time.perf_counter() - started
    print(f"heuristic extraction: {len(dialogues)} dialogues, {turns} turns, {units} units "
          f"({units / turns:.3f} units/turn) in {seconds:.2f} s = {turns / seconds:,.0f} turns/s")

    from qgmem.memory.extract_parser import ParserExtractor

    parser_extractor = ParserExtractor(config)
    parser_extractor.nlp  # load spaCy outside the timing
    parsed_dialogues = dialogues[: args.parser_dialogues]
    started, cpu = time.perf_counter(), time.process_time()
    units = turns = 0
    for d in parsed_dialogues:
        units += len(parser_extractor.extract_windows(make_windows(d, config.window_size, config.window_overlap), d.id))
        turns += d.num_turns()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"parser extraction (rules + spaCy, memo by text): {len(parsed_dialogues)} dialogues, {turns} turns, "
          f"{units} units, {parser_extractor.parsed_sentences} sentences parsed, {parser_extractor.memo_hits} "
          f"memo hits, {seconds:.1f} s wall / {cpu:.1f} s CPU = {turns / seconds:,.0f} turns/s "
          f"({turns / cpu:,.0f} per CPU-second)")

    from qgmem.embed import SentenceEncoder

    encoder = SentenceEncoder()
    builder = MemoryBuilder(config, encoder)
    started = time.perf_counter()
    for d in dialogues[: args.build_dialogues]:
        builder.build(d)
    seconds = time.perf_counter() - started
    s = builder.stats
    print(f"{config.extractor} full build (MiniLM on CPU): {s.dialogues} dialogues, {s.turns} turns, {s.units} units, "
          f"{s.traces} traces ({s.updates} updates, {s.supplements} supplements) in {seconds:.1f} s "
          f"= {s.turns / seconds:,.0f} turns/s")

    from qgmem.lm import EMBEDDED_LM, load_tokenizer
    from qgmem.llm.backends import CallableBackend

    tokenizer = load_tokenizer(EMBEDDED_LM)

    def count(messages_text: str) -> int:
        return len(tokenizer(messages_text, add_special_tokens=False)["input_ids"])

    class TemplateCounted(CallableBackend):
        """Counts prompt tokens over the chat-template rendering, as the local backend does."""

        def _chat(self, conversations, *, max_new_tokens, temperature):
            results = super()._chat(conversations, max_new_tokens=max_new_tokens, temperature=temperature)
            for r, m in zip(results, conversations):
                r.prompt_tokens = count(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False))
            return results

    backend = TemplateCounted(recorded_reply, "recorded", count_tokens=count)
    llm_builder = MemoryBuilder(ConstructionConfig(extractor="llm"), encoder, llm=backend)
    for d in dialogues[: args.llm_dialogues]:
        llm_builder.build(d)
    s = llm_builder.stats
    print(f"LLM path (recorded backend, SmolLM2 tokenizer): {s.dialogues} dialogues, {s.turns} turns, "
          f"{s.windows} windows, {s.llm_requests} calls = {s.llm_requests / s.turns:.3f} calls/turn "
          f"(construction {s.windows / s.turns:.3f}, consolidation {(s.llm_requests - s.windows) / s.turns:.3f}), "
          f"{s.prompt_tokens / s.turns:,.0f} prompt tokens/turn, {s.completion_tokens / s.turns:,.0f} completion "
          f"tokens/turn (recorded replies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
