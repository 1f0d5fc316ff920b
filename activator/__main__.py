"""``python -m activator``: the activator in front of a shared state store (cluster mode)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from activator.app import create_app
from activator.server import create_server, loop_factory
from activator.settings import ActivatorSettings
from activator.state import Lifecycle


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m activator", description="the public endpoint that wakes models"
    )
    parser.add_argument("--state", default=None, help="state store URL: redis://... or memory://")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--activator-id", default=None, help="default: <hostname>-<pid>")
    parser.add_argument("--log-level", default="info")
    return parser


async def _serve(settings: ActivatorSettings, activator_id: str) -> None:
    # Imported here: a cluster store pulls in its client library only when it is used.
    from control_plane.store.factory import open_state_store

    try:
        store = open_state_store(settings.state_url)
    except ValueError as exc:
        raise SystemExit(f"activator: {exc}") from None
    try:
        lifecycle = Lifecycle()
        app = create_app(
            settings, store, store.request_activation, activator_id, lifecycle=lifecycle
        )
        await create_server(app, settings, lifecycle).serve()
    finally:
        await store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    overrides = {
        key: value
        for key, value in (("state_url", args.state), ("host", args.host), ("port", args.port))
        if value is not None
    }
    try:
        settings = ActivatorSettings(**overrides)
    except ValidationError as exc:
        print(f"activator: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    activator_id = args.activator_id or f"{socket.gethostname()}-{os.getpid()}"
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_serve(settings, activator_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
