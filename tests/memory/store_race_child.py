"""Run by tests/memory/test_store.py in a child process: save or load one store many times, print the errors."""

from __future__ import annotations

import json
import sys

import numpy as np

from qgmem.memory.store import MemoryStore


def main(role: str, folder: str, times: int) -> None:
    errors = []
    store = MemoryStore(dialogue_id="d", embeddings=np.ones((0, 4), dtype=np.float32), meta={"role": role})
    for _ in range(times):
        try:
            if role == "writer":
                store.save(folder)
            else:
                MemoryStore.load(folder)
        except Exception as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps({"role": role, "errors": errors}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
