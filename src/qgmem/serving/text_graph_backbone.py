"""The text-graph LM backbone (``--backbone api``, the paper's GPT-4o-mini setting): a hosted LLM reads
the graph as text instead of the graph-token LM reading a graph token.

A closed model cannot take a graph token, so the local graph goes into the prompt as
``(subject; relation; object) [Mi]`` triples after the textual working memory (the same system prompt
and wording as the graph-token path, :mod:`qgmem.prompting`). Requests go through the shared
OpenAI-compatible backend (:mod:`qgmem.llm`), so retries, deadlines and the response cache are the
ones every LLM step uses. ``graph`` keeps its meaning: ``token`` sends the question's own triples,
``none`` the working memory alone, ``shuffled`` another question's triples.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from qgmem.activation.serialize import count_tokens, serialize_graph_triples
from qgmem.model.graph_modes import shuffled
from qgmem.prompting import PromptSettings, build_messages, final_answer, memory_with_graph_text, reply_shape
from qgmem.prompting.contract import first_entries
from qgmem.serving.records import Answer, cited_labels, graph_json, memory_json


class TextGraphBackbone:
    """Answers from an LLM backend given the textual working memory plus the text-serialized local graph."""

    def __init__(self, backend: Any, prompt: PromptSettings | None = None, max_new_tokens: int = 64,
                 tokenizer: Any = None):
        self.backend = backend
        self.prompt = prompt or PromptSettings()
        self.max_new_tokens = max_new_tokens
        self.tokenizer = tokenizer  # counts retrieved-context tokens (the backend reports the prompt's)

    def memory_block(self, retrieved, graph_source) -> str:
        graph_text = serialize_graph_triples(graph_source.memory.graph) if graph_source is not None else ""
        # the text budget (prompt.memory_units) keeps the top m entries; the triples cover the graph's k units
        return memory_with_graph_text(first_entries(retrieved.memory.text, self.prompt.memory_units), graph_text)

    def generate(self, retrieved: Sequence[Any], graph_mode: str = "token") -> list[Any]:
        sources = list(retrieved) if graph_mode != "none" else [None] * len(retrieved)
        if graph_mode == "shuffled":
            sources = shuffled(sources, alone=None)  # alone: no triples, the empty graph as text
        blocks = [self.memory_block(r, s) for r, s in zip(retrieved, sources)]
        conversations = [build_messages(block, r.question, self.prompt.system_prompt)
                         for block, r in zip(blocks, retrieved)]
        started = time.perf_counter()
        results = self.backend.chat(conversations, max_new_tokens=self.max_new_tokens, temperature=0.0)
        per_qa = (time.perf_counter() - started) / max(1, len(retrieved))
        answers = []
        for r, block, result in zip(retrieved, blocks, results):
            text = "" if result.error else final_answer(result.text, self.prompt.first_line)
            seconds = {**r.seconds, "graph_encoding": 0.0, "generation": per_qa}
            seconds["total"] = sum(seconds.values())
            context = count_tokens(block, self.tokenizer) if self.tokenizer is not None else len(block.split())
            tokens = {"retrieved_context": context, "prompt": int(result.prompt_tokens), "graph": 0,
                      "generated": int(result.completion_tokens)}
            tokens["total"] = tokens["prompt"] + tokens["generated"]
            answer = Answer(r.question, text, graph_mode, cited_labels(text, len(r.memory.units)), memory_json(r.memory),
                            graph_json(r.memory.graph), seconds, tokens, 0, error=result.error,
                            finish_reason="length" if tokens["generated"] >= self.max_new_tokens else "stop",
                            reply_shape=None if result.error else reply_shape(result.text))
            answers.append(answer)
        return answers
