"""The cache build's replay on several worker processes of one machine (``cache_processes``).

Why: a heuristic replay is one Python thread of parsing, extraction and activation beside the sentence
encoder's matrix products, so one process keeps about 1.5 of 2 cores busy (``docs/BENCHMARKS.md``,
*Cache build on both cores*). Each worker has its own models and ``cores / processes`` threads, and
writes a case's shard exactly as the serial build does (:func:`~qgmem.samples.build.replay_case`). The
parent only hands out cases, counts them and reports.

Worker ``w`` of ``N`` replays the cases at positions ``w, w + N, …`` of the build's list, in order, not
the next case whoever is free: a vector is what the encoder returned for the batch the text first came
in, so with a shared queue the batches, and the last bits of the vectors, followed the workers' timing,
and near-ties in the ranking flipped between two runs of the same command (15 of the default's samples
differed in their graph's facts; ``bench/cache/cache_processes.py --processes 2 --rounds 2``). With fixed
shares the same command builds the same dataset.

What differs from the serial build: each worker's embedding memo starts from the chunks on disk and
meets only its share of the cases, so a text may be encoded in another batch than the serial build
would have used, which moves its float32 vector in the last bits (about 3e-7). With a deterministic
encoder the datasets are equal (``tests/samples/test_replay_pool.py``).

A failed case stops a strict build with the worker's message; a worker that dies (killed, out of
memory) stops it with its exit code. The shards already written are kept, so a rerun goes on from there.
"""

from __future__ import annotations

import logging
import os
import queue
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

log = logging.getLogger(__name__)

#: the thread-count variables a worker gets (read by torch, OpenBLAS and MKL when they load)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: seconds between liveness checks of the workers while no message arrives
POLL_S = 1.0
#: seconds a worker that reported "done" gets to exit before it is stopped
EXIT_S = 60.0


class WorkerFailed(RuntimeError):
    """A replay worker stopped: a failed case (strict build) or a process that died."""


def replay_in_processes(spec: Any, samples: Any, plan: Sequence[tuple[str, Any]], todo: Sequence[int],
                        processes: int, shard: Any, *, replayer: Callable[..., Any], replay: Callable[..., None],
                        encoder: Any = None, on_case: Callable[[int], None] | None = None) -> dict[str, int]:
    """Replay the cases ``todo`` (indices into ``plan``) on ``processes`` spawned workers.

    ``replayer(spec, encoder)`` makes a worker's models and ``replay(replayer, samples, plan, index,
    shard)`` replays one case into its shard (the build's :class:`~qgmem.samples.build.Replayer` and
    :func:`~qgmem.samples.build.replay_case`, passed in by reference so the two modules do not import
    each other). ``encoder`` is a picklable stand-in (tests); ``None`` loads the configured one in each worker.
    ``on_case(index)`` runs in this process as each case's shard is written. Returns the workers'
    embedding-memo counts added up (``encoded``, ``hits``, ``loaded``).
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # no forked copies of torch's or tokenizers' threads
    shares, results = [context.Queue() for _ in range(processes)], context.Queue()
    for jobs in shares:  # a process never waits at exit to feed these (see _check_alive)
        jobs.cancel_join_thread()
    for position, index in enumerate(todo):  # fixed shares: the same run gives the same batches
        shares[position % processes].put((index, plan[index]))
    for jobs in shares:
        jobs.put(None)
    threads = max(1, _cores() // processes)
    workers = []
    with _thread_environment(threads):
        for number in range(processes):
            worker = context.Process(target=_work, name=f"qgmem-cache-{number}", daemon=True,
                                     args=(replayer, replay, spec, encoder, str(samples.root), shard, threads,
                                           shares[number], results))
            worker.start()
            workers.append(worker)
    log.info("cache: %d cases on %d worker processes, %d thread(s) each", len(todo), processes, threads)
    memo = {"encoded": 0, "hits": 0, "loaded": 0}
    finished = 0
    try:
        while finished < processes:
            try:
                kind, index, payload = results.get(timeout=POLL_S)
            except queue.Empty:
                _check_alive(workers)
                continue
            if kind == "case":
                if on_case is not None:
                    on_case(index)
            elif kind == "done":
                finished += 1
                for key in memo:
                    memo[key] += int((payload or {}).get(key, 0))
            else:
                message, trace = payload
                log.debug("cache worker traceback:\n%s", trace)
                raise WorkerFailed(message)
    finally:
        for worker in workers:  # after "done" a worker is still exiting: let it, or its semaphores leak
            worker.join(timeout=EXIT_S if finished == processes else 0)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        for jobs in shares:
            jobs.close()
        results.close()
    return memo


def _check_alive(workers) -> None:
    """Stop the build when a worker ended before its "done".

    Exit code 1 is most often a script that starts the build from its top level without an
    ``if __name__ == "__main__":`` guard: a spawned worker imports the main module, so it runs the
    build again and Python refuses to start processes from it. Its own job queues would keep that
    worker waiting at exit, with the parent polling it for ever, were their feeders not released at
    creation (``cancel_join_thread``)."""
    for worker in workers:
        if worker.exitcode not in (None, 0):
            hint = ("; a script that builds the cache must guard its top level with "
                    "`if __name__ == \"__main__\":` (each worker imports the main module), or set "
                    "data.cache_processes: 1") if worker.exitcode == 1 else " (killed, or out of memory?)"
            raise WorkerFailed(f"cache worker {worker.name} (pid {worker.pid}) stopped with exit code "
                               f"{worker.exitcode} before it finished{hint}; the shards written so far "
                               "are kept and a rerun continues from them")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextmanager
def _thread_environment(threads: int) -> Iterator[None]:
    """The workers' thread counts, in the environment a spawned process starts from (then restored)."""
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: str(threads) for name in THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _work(make_replayer, replay, spec, encoder, root: str, shard, threads: int, jobs, results) -> None:
    """One worker: its own models, then its share of the cases from ``jobs`` until the stop sign (``None``)."""
    import torch

    from qgmem.samples import cache as C

    torch.set_num_threads(threads)
    samples, replayer, index = C.SampleCache(root), None, None
    try:
        replayer = make_replayer(spec, encoder)
        while (job := jobs.get()) is not None:
            index, entry = job
            replay(replayer, samples, {index: entry}, index, shard)
            results.put(("case", index, None))
        replayer.close()  # persists the vectors this worker encoded
        results.put(("done", None, replayer.memo.stats() if replayer.memo is not None else {}))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which stops the build
        if replayer is not None:
            try:
                replayer.close()
            except Exception:  # noqa: BLE001 - the case's own error is the one to report
                pass
        message = str(exc) if str(exc).startswith(f"case {index} (") else f"{type(exc).__name__}: {exc}"
        if index is not None and not message.startswith("case "):
            message = f"case {index}: {message}"
        results.put(("error", index, (message, traceback.format_exc())))


__all__ = ["WorkerFailed", "replay_in_processes"]
