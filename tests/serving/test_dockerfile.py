"""The container: the Dockerfile is read as Docker reads it (instruction by instruction) and its
entry point is parsed by ``qgmem serve``'s own flags, so a renamed flag or a dropped volume fails here."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from jsonargparse import ArgumentParser

from qgmem.serving import serve_cli
from qgmem.serving.storage.sqlite import sqlite_path

ROOT = Path(__file__).resolve().parents[2]


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs: comments dropped, ``\\`` continuations joined."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def exec_form(args: str) -> list[str]:
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def test_the_dockerfile_runs_qgmem_serve_as_a_non_root_user_with_a_store_volume_and_a_health_check():
    steps = instructions((ROOT / "Dockerfile").read_text())
    kinds = [k for k, _ in steps]
    first = dict(reversed(steps))  # the first of each kind
    last = dict(steps)
    assert kinds[0] == "FROM" and "cuda" not in first["FROM"].lower()
    assert "download.pytorch.org/whl/cpu" in " ".join(a for k, a in steps if k == "RUN")  # CPU torch
    assert "convert_embedded_lm" in " ".join(a for k, a in steps if k == "RUN")  # embedded LM converted at build

    user = last["USER"].split(":")[0]
    assert user not in ("root", "0") and user.isdigit()  # numeric: resolvable by the host
    assert kinds.index("USER") < kinds.index("ENTRYPOINT")

    entry = exec_form(last["ENTRYPOINT"]) + exec_form(last["CMD"])
    assert entry[:2] == ["qgmem", "serve"]
    parser = ArgumentParser(exit_on_error=False)  # the parser qgmem's commands use
    serve_cli.add_arguments(parser)
    settings = serve_cli.resolve(parser.parse_args(entry[2:]))  # the flags exist and pass the checks
    assert settings.host == "0.0.0.0" and settings.load.export == "/export"
    assert settings.store.startswith("sqlite:///")
    assert exec_form(last["VOLUME"]) == [str(sqlite_path(settings.store).parent)]  # the database file on the volume
    assert last["EXPOSE"] == str(settings.port)

    health = last["HEALTHCHECK"]
    assert re.search(rf"http://127\.0\.0\.1:{settings.port}/healthz", health) and "CMD" in health


def test_the_build_context_holds_only_the_package():
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*")] == "*" and {"!pyproject.toml", "!README.md", "!src/"} <= set(ignore)
    steps = instructions((ROOT / "Dockerfile").read_text())
    copied = [source for k, a in steps if k == "COPY" for source in exec_form(a)[:-1]]
    kept = {i.rstrip("/") for i in ignore if i.startswith("!")}
    assert copied and all(f"!{c.rstrip('/')}" in kept for c in copied), copied


def test_the_compose_file_runs_replicas_over_postgres_with_pgvector():
    """compose.yaml (it cannot be run here): read as YAML, each replica's command parsed by ``qgmem
    serve``'s flags with the entry point of the image, its store the compose Postgres, and no secret in it."""
    import yaml

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    db, serve = services["postgres"], services["qgmem"]
    assert db["image"].startswith("pgvector/pgvector:pg16")
    assert db["healthcheck"]["test"][:2] == ["CMD", "pg_isready"] and "volumes" in db
    assert serve["build"] == "." and serve["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert serve["deploy"]["replicas"] >= 2 and "ports" not in serve  # replicas sit behind the proxy
    last = dict(instructions((ROOT / "Dockerfile").read_text()))
    parser = ArgumentParser(exit_on_error=False)
    serve_cli.add_arguments(parser)
    settings = serve_cli.resolve(parser.parse_args(exec_form(last["ENTRYPOINT"])[2:] + serve["command"]))
    assert settings.store.startswith("postgresql://") and "@postgres:5432/" in settings.store
    assert "${POSTGRES_PASSWORD" in settings.store and "${POSTGRES_PASSWORD" in db["environment"]["POSTGRES_PASSWORD"]
    proxy = services["proxy"]
    assert proxy["depends_on"] == ["qgmem"] and proxy["ports"] == ["127.0.0.1:8000:8000"]
