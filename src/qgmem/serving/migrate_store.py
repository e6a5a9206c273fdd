"""``qgmem migrate-store --from DIR --to URL``: the users of an earlier version's store root (a journal and
snapshots per user) moved into a database (:mod:`qgmem.serving.storage.folders`). Safe to rerun: users
already in the database are skipped; each user moves in one transaction."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", required=True, metavar="DIR",
                        help="store root of the folder format (the old --store-root, e.g. memories)")
    parser.add_argument("--to", dest="target", required=True, metavar="URL",
                        help="the store: sqlite:///PATH or postgresql://… (qgmem serve --store takes the same URL)")


def run(args: argparse.Namespace) -> int:
    from qgmem.serving.storage import open_store
    from qgmem.serving.storage.folders import migrate

    store = open_store(args.target)
    try:
        counts = migrate(Path(args.source), store, log=lambda line: print(line, file=sys.stderr))
    finally:
        store.close()
    print(f"moved {counts['users']} users ({counts['units']} units) from {args.source} to {store.url_shown()}; "
          f"{counts['already_there']} already there"
          + (f"; {counts['replayed_at_load']} with changes past their snapshot (replayed at their first load)"
             if counts["replayed_at_load"] else ""))
    return 0
