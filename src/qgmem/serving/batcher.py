"""Questions that arrive together share one LM forward: a bounded queue and one generation thread.

Request handlers activate their question (each over its own user's memory) and submit the
:class:`~qgmem.serving.pipeline.Retrieved` result. The generation thread takes the first waiting job,
gathers whatever else arrives within ``max_wait_ms`` (up to ``max_batch``), and answers the batch with
one batched ``generate`` per graph mode: one padded forward per decoding step for all of them. The
queue holds at most ``max_queue`` jobs; :meth:`Batcher.submit` past that raises :class:`QueueFull`,
which the server answers with 503 and ``Retry-After``.

A job may ask for its tokens as they are decoded (``on_text``: called from the generation thread with
each new piece of the answer), which is what ``stream: true`` sends as server-sent events.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable


class QueueFull(Exception):
    """More questions wait than the queue holds."""


@dataclass
class Job:
    retrieved: Any
    graph_mode: str = "token"
    on_text: Callable[[str], None] | None = None
    future: Future = field(default_factory=Future)
    queued_at: float = field(default_factory=time.perf_counter)


class RowStreamer:
    """A ``transformers`` streamer for a batch: hands each row's new text to that row's callback.

    The answer is read back by the answer cut (its first line that holds an answer, repaired; the stop
    tokens end a row), so a row's text is cut there and nothing after it is sent.
    """

    def __init__(self, tokenizer: Any, callbacks: list[Callable[[str], None] | None], stop_ids: set[int],
                 first_line: bool = True, caps: list[int | None] | None = None):
        self.tokenizer, self.callbacks, self.stop_ids, self.first_line = tokenizer, callbacks, stop_ids, first_line
        self.caps = caps or [None] * len(callbacks)  # a row's answer cap: nothing past it is sent
        self.ids: list[list[int]] = [[] for _ in callbacks]
        self.sent = [""] * len(callbacks)
        self.texts = [""] * len(callbacks)  # text given by add_text
        self.done = [cb is None for cb in callbacks]

    def put(self, value) -> None:
        if value.dim() != 1:  # the prompt (when given as ids), not a decoding step
            return
        for row, token in enumerate(value.tolist()):
            if row >= len(self.callbacks) or self.done[row]:
                continue
            if token in self.stop_ids:
                self.done[row] = True
                continue
            self.ids[row].append(token)
            if self.caps[row] is not None and len(self.ids[row]) >= self.caps[row]:
                self.done[row] = True  # this token is the row's last (the batch may decode on for others)
            self.show(row, self.tokenizer.decode(self.ids[row], skip_special_tokens=True))

    def add_text(self, row: int, piece: str) -> None:
        """A new piece of ``row``'s text decoded elsewhere (an engine behind ``--lm-url``)."""
        self.texts[row] += piece
        self.show(row, self.texts[row])

    def show(self, row: int, text: str) -> None:
        """Send what ``row``'s answer so far adds to what was sent: the answer cut's reading of the text
        so far (:func:`~qgmem.prompting.answer.shown_so_far`), so the pieces add up to the final answer."""
        if self.first_line:
            from qgmem.prompting.answer import shown_so_far

            text, complete = shown_so_far(text)
            self.done[row] = self.done[row] or complete
        text = text.lstrip()
        if text.startswith(self.sent[row]) and len(text) > len(self.sent[row]):
            piece, self.sent[row] = text[len(self.sent[row]):], text
            if "\ufffd" not in piece:  # half a multi-byte character: wait for the rest
                self.callbacks[row](piece)
            else:
                self.sent[row] = text[: len(text) - len(piece)]

    def end(self) -> None:
        pass


class Batcher:
    """One generation thread over ``pipeline`` (see the module docstring)."""

    def __init__(self, pipeline: Any, max_batch: int = 8, max_wait_ms: float = 5.0, max_queue: int = 64,
                 observe: Callable[[str, float], None] | None = None):
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch and max_queue must be >= 1 and max_wait_ms >= 0")
        self.pipeline, self.max_batch, self.max_wait = pipeline, max_batch, max_wait_ms / 1e3
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.observe = observe or (lambda stage, seconds: None)
        self.batches = 0
        self.batched_questions = 0
        self._thread = threading.Thread(target=self._run, name="qgmem-generate", daemon=True)
        self._thread.start()

    def submit(self, retrieved: Any, graph_mode: str = "token", on_text: Callable[[str], None] | None = None) -> Future:
        """Queue one activated question; the future gives ``(Answer, size of the batch it was in)``."""
        job = Job(retrieved, graph_mode, on_text)
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"{self.queue.maxsize} questions are waiting") from None
        return job.future

    def depth(self) -> int:
        return self.queue.qsize()

    def close(self) -> None:
        try:
            self.queue.put(None, timeout=1.0)
        except queue.Full:
            pass
        self._thread.join(timeout=30.0)

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            jobs = [first]
            deadline = time.perf_counter() + self.max_wait
            while len(jobs) < self.max_batch:
                try:
                    job = self.queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if job is None:
                    self._answer(jobs)
                    return
                jobs.append(job)
            self._answer(jobs)

    def _answer(self, jobs: list[Job]) -> None:
        started = time.perf_counter()
        for job in jobs:
            self.observe("queue", started - job.queued_at)
        self.batches += 1
        self.batched_questions += len(jobs)
        by_mode: dict[str, list[Job]] = {}
        for job in jobs:
            by_mode.setdefault(job.graph_mode, []).append(job)
        for graph_mode, group in by_mode.items():
            try:
                streamer = None
                if any(j.on_text is not None for j in group) and self.pipeline.prompts is not None:
                    settings = self.pipeline.prompt_settings
                    streamer = RowStreamer(self.pipeline.tokenizer, [j.on_text for j in group],
                                           set(self.pipeline.prompts.stop_ids),
                                           settings.first_line and not settings.enable_thinking,
                                           [self.pipeline.answer_cap(j.retrieved) for j in group])
                answers = self.pipeline.generate([j.retrieved for j in group], graph_mode=graph_mode, streamer=streamer)
            except Exception as exc:  # noqa: BLE001 - every waiting request gets the error, the thread lives on
                for job in group:
                    job.future.set_exception(exc)
                continue
            for job, answer in zip(group, answers):
                answer.seconds["queue"] = started - job.queued_at
                job.future.set_result((answer, len(group)))
