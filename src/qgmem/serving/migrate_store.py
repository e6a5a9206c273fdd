"""``qgmem migrate-store --from DIR --to URL``: the users of an earlier version's store root (a journal and
snapshots per user) moved into a database (:mod:`qgmem.serving.storage.folders`). Safe to rerun: users
already in the database are skipped; each user moves in one transaction."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from qgmem.errors import UserError
from qgmem.settings_flags import add_settings_arguments, settings_from_args


@dataclass
class MigrateStoreSettings:
    """What ``qgmem migrate-store`` runs with; one field per flag (``--from`` and ``--to``: ``from`` is a keyword)."""

    #: store root of the folder format (the old --store-root, e.g. memories)
    source: str = field(default="", metadata={"flag": "from", "metavar": "DIR"})
    #: the store: sqlite:///PATH or postgresql://… (qgmem serve --store takes the same URL)
    target: str = field(default="", metadata={"flag": "to", "metavar": "URL"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, MigrateStoreSettings)


def run(args: argparse.Namespace) -> int:
    from qgmem.serving.storage import open_store
    from qgmem.serving.storage.folders import migrate

    s = settings_from_args(MigrateStoreSettings, args)
    for flag, value in (("--from", s.source), ("--to", s.target)):
        if not value:  # named by the flag a user types, not the settings key
            raise UserError(f"{flag} is required (qgmem migrate-store --from DIR --to URL)")
    store = open_store(s.target)
    try:
        counts = migrate(Path(s.source), store, log=lambda line: print(line, file=sys.stderr))
    finally:
        store.close()
    print(f"moved {counts['users']} users ({counts['units']} units) from {s.source} to {store.url_shown()}; "
          f"{counts['already_there']} already there"
          + (f"; {counts['replayed_at_load']} with changes past their snapshot (replayed at their first load)"
             if counts["replayed_at_load"] else ""))
    return 0
