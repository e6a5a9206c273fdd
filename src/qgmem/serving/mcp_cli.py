"""``qgmem mcp``: the memory service's MCP tools on stdio, for a desktop MCP client that starts it.

Its flags are ``qgmem serve``'s (:class:`~qgmem.serving.serve_cli.ServeSettings`: the export, the store,
the limits; ``--host``, ``--port`` and the key are not used on stdio), so both read one store the same
way. Standard output carries only the protocol; everything else goes to standard error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from qgmem.serving import serve_cli



def add_arguments(parser) -> None:
    serve_cli.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    settings = serve_cli.resolve(args)
    try:
        import mcp  # noqa: F401
    except ImportError:
        from qgmem.errors import UserError

        raise UserError("qgmem mcp needs the mcp package (pip install -e '.[serve]')") from None
    from qgmem.serving.mcp import mcp_server

    with contextlib.redirect_stdout(sys.stderr):  # a model loader's print must not corrupt the protocol
        if settings.threads:
            import torch

            torch.set_num_threads(settings.threads)
        service = serve_cli.build_service(settings)
    print(f"qgmem mcp: {settings.load.export} on stdio (memories in {service.users.store.url_shown()})", file=sys.stderr, flush=True)
    try:
        mcp_server(service).run("stdio")
    finally:
        service.close()
    return 0
