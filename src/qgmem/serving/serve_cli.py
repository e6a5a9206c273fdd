"""``qgmem serve``: the export as a memory service over HTTP (see :mod:`qgmem.serving.server`).

Every setting is a field of :class:`ServeSettings` and a typed flag (``--store``, ``--max-batch`` …),
parsed by jsonargparse as the other commands are: ``--config FILE`` reads them from YAML (keys are the
field names; flags given after it win) and ``--print_config`` prints the resolved settings. Needs the ``serve`` extra: ``pip install -e '.[serve]'``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from qgmem.errors import UserError
from qgmem.older_records import SERVE_FLAGS
from qgmem.serving.export_models import LoadSettings
from qgmem.serving.storage import DEFAULT_STORE, open_store, store_kind
from qgmem.serving.storage.folders import refuse_folder_root
from qgmem.serving.storage.postgres import POOL_SIZE
from qgmem.settings_flags import add_retired_arguments, add_settings_arguments, settings_from_args


@dataclass
class ServeSettings:
    """What ``qgmem serve`` runs with; one field per flag."""

    load: LoadSettings = field(default_factory=LoadSettings)  # --export, --device, --max-new-tokens, --lm-*
    store: str = DEFAULT_STORE  #: where the users' memories persist: sqlite:///PATH (one file, the default) or postgresql://… (any libpq URL; many replicas may share it)
    pool_size: int = POOL_SIZE  #: database connections per replica (postgresql:// stores)
    host: str = "127.0.0.1"  #: address to bind (default: this machine only)
    port: int = 8000  #: TCP port
    api_key_env: str | None = None  #: NAME of the environment variable holding the bearer key (the key is never logged)
    lm_dtype: str | None = None  #: the LM's weights: float32 | bfloat16 | float16 (default: the export's); check answers stay the same (docs/serving.md)
    threads: int | None = None  #: torch CPU threads (default: torch's; on a CPU shared with other jobs 1 is much faster)
    max_batch: int = 8  #: questions answered in one LM forward at most
    max_wait_ms: float = 5.0  #: how long the first question of a batch waits for others
    max_queue: int = 64  #: questions that may wait for the LM; past this a request gets 503 + Retry-After
    snapshot_every: int = 1  #: store a snapshot of a user's memory every N changes, in the change's transaction (fewer snapshots: cheaper appends, longer cold loads)
    max_body_bytes: int = 1_000_000  #: larger bodies get 413
    max_import_bytes: int = 200_000_000  #: the body of POST /v1/users/{id}/import (an export of a whole user) at most; larger gets 413
    max_turns: int = 500  #: turns per appended session (past: 413)
    max_turn_chars: int = 8_000  #: characters per turn (past: 413)
    max_json_containers: int = 2_000_000  #: objects and arrays one request body may hold (every '{' and '[' counted, before parsing; an import's too); past: 413
    max_concurrent_imports: int = 2  #: imports read, parsed and stored at once; one more gets 503 + Retry-After
    body_timeout_s: float = 30.0  #: a request body not received within this many seconds gets 408 and the connection is closed
    max_loaded_users: int | None = None  #: users held in memory at most; the least recently used is unloaded (reloaded from the store on its next request)
    max_loaded_units: int | None = None  #: memory units held in memory at most (the memory budget), least recently used users unloaded first
    idle_unload_s: float | None = 900.0  #: unload a user idle for this many seconds (reloaded from its snapshot and changes on the next request)
    log_level: str = "info"  #: uvicorn's log level (request lines hold method, path and status, never bodies)




def add_arguments(parser) -> None:
    """One typed flag per :class:`ServeSettings` field (its type hint, default and ``#:`` comment)."""
    add_settings_arguments(parser, ServeSettings)
    add_retired_arguments(parser, SERVE_FLAGS)


def resolve(args: argparse.Namespace) -> ServeSettings:
    """The settings the parser resolved (defaults, then ``--config``, then the flags given), checked."""
    settings = settings_from_args(ServeSettings, args)
    check(settings)
    return settings


def check(s: ServeSettings) -> None:
    s.load.check()
    for name in ("max_batch", "max_queue", "snapshot_every", "pool_size", "max_body_bytes", "max_import_bytes", "max_turns",
                 "max_turn_chars", "max_json_containers", "max_concurrent_imports"):
        if getattr(s, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(s, name)}")
    if not 0 < s.port < 65536:
        raise UserError(f"--port must be in 1..65535, got {s.port}")
    if s.threads is not None and s.threads < 1:
        raise UserError(f"--threads must be >= 1, got {s.threads}")
    for name in ("max_loaded_users", "max_loaded_units"):
        if getattr(s, name) is not None and getattr(s, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(s, name)}")
    for name in ("body_timeout_s", "idle_unload_s"):
        if getattr(s, name) is not None and not getattr(s, name) > 0:
            raise UserError(f"--{name.replace('_', '-')} must be > 0, got {getattr(s, name)}")
    if s.lm_dtype not in (None, "auto", "float32", "bfloat16", "float16"):
        raise UserError(f"--lm-dtype must be one of auto, float32, bfloat16, float16, got {s.lm_dtype!r}")
    if s.max_wait_ms < 0:
        raise UserError(f"--max-wait-ms must be >= 0, got {s.max_wait_ms}")
    refuse_folder_root(s.store)
    store_kind(s.store)


def api_key(settings: ServeSettings) -> str | None:
    if not settings.api_key_env:
        return None
    key = os.environ.get(settings.api_key_env)
    if not key:
        raise UserError(f"--api-key-env names {settings.api_key_env!r}, but that environment variable is not set")
    return key


#: the names a browser uses for this machine: a server bound to one of them answers only requests naming one
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


def guard_host(app, host: str) -> None:
    """A server bound to this machine only answers requests whose ``Host`` names this machine (400 otherwise):
    a web page cannot reach it through DNS rebinding, a key or none. Bound elsewhere (behind a proxy), the
    proxy names the hosts it serves."""
    if host in LOOPBACK_HOSTS:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOSTS))


def build_service(settings: ServeSettings):
    """Load the models once (the path `qgmem answer` and `eval-qa` use) and open the store (its schema
    migrated to this version's); ``settings`` are :func:`check`'s."""
    from qgmem.serving.export_models import load_settings_models
    from qgmem.serving.server import Limits, MemoryService

    pipeline = load_settings_models(settings.load, lm_dtype=settings.lm_dtype)
    limits = Limits(max_body_bytes=settings.max_body_bytes, max_import_bytes=settings.max_import_bytes,
                    max_turns=settings.max_turns,
                    max_turn_chars=settings.max_turn_chars, body_timeout_s=settings.body_timeout_s,
                    max_json_containers=settings.max_json_containers,
                    max_concurrent_imports=settings.max_concurrent_imports)
    options = {"pool_size": settings.pool_size} if store_kind(settings.store) == "postgresql" else {}
    return MemoryService(pipeline, open_store(settings.store, **options), max_batch=settings.max_batch, max_wait_ms=settings.max_wait_ms,
                         max_queue=settings.max_queue, snapshot_every=settings.snapshot_every, limits=limits,
                         max_loaded_users=settings.max_loaded_users, max_loaded_units=settings.max_loaded_units,
                         idle_unload_s=settings.idle_unload_s)


def run(args: argparse.Namespace) -> int:
    settings = resolve(args)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise UserError("qgmem serve needs the 'serve' extra: pip install -e '.[serve]'") from None
    key = api_key(settings)
    from qgmem.serving.server import create_app

    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    service = build_service(settings)
    app = create_app(service, api_key=key)
    guard_host(app, settings.host)
    print(f"qgmem serve: {settings.load.export} on http://{settings.host}:{settings.port} (memories in "
          f"{service.users.store.url_shown()}; {len(service.users.user_ids())} users; "
          f"{'bearer key from $' + settings.api_key_env if key else 'no key'})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level)
    return 0
