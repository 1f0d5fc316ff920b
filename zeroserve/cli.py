"""``zeroserve <command>``: argument parsing only; each command hands off to its component."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

if TYPE_CHECKING:
    from control_plane.settings import ControlPlaneSettings

_START_FAILURE = 3
"""The exit status when a server's startup fails (uvicorn's, which the servers kept)."""


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run a standalone inference server over a model repository (like tritonserver)",
    )
    serve.add_argument(
        "--model-repository", help="Triton-layout model repository: a folder or s3://bucket/prefix"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="port of the gRPC server (default 8001, as Triton's); 0 serves no gRPC",
    )
    serve.add_argument("--model-control-mode", choices=["none", "explicit", "poll"], default="none")
    serve.add_argument(
        "--repository-poll-secs",
        type=float,
        default=None,
        help="seconds between two scans of the repository in poll mode (default 15)",
    )
    serve.add_argument(
        "--id",
        default=None,
        help="the server's name in its metadata (default: triton, as Triton's)",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="model to load at start in explicit mode; '*' loads all (repeatable)",
    )
    serve.add_argument("--cache-dir", type=Path, default=None)
    serve.add_argument(
        "--http-max-input-size", type=int, default=None, help="largest request body, bytes"
    )
    serve.add_argument("--exit-timeout-secs", type=float, default=None)
    serve.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="local,size=BYTES",
        help="the response cache, as Triton's flag: local,size=<bytes>",
    )
    serve.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="request tracing, as Triton's flag (repeatable): level=TIMESTAMPS, rate=<n>, "
        "count=<n>, mode=triton|opentelemetry, triton,file=<path>, triton,log-frequency=<n>, "
        "opentelemetry,url=<url>, opentelemetry,resource=<key>=<value>",
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="generate a demo ONNX model into the repository folder (./demo-models by default)",
    )
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from data_plane.response_cache import cache_config_overrides
    from data_plane.server import run
    from data_plane.settings import DataPlaneSettings, ModelControlMode
    from data_plane.trace.options import trace_config_overrides

    repository: str | None = args.model_repository
    if args.demo:
        from data_plane.demo import DEMO_MODEL, write_demo_repository

        repository = repository or "demo-models"
        write_demo_repository(Path(repository))
        print(
            f"demo model '{DEMO_MODEL}' in {repository}; try:\n"
            f"  curl -s -X POST http://{args.host}:{args.http_port}/v2/models/{DEMO_MODEL}/infer"
            ' -d \'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],'
            '"data":[1,2,3,4]}]}\'',
            flush=True,
        )
    if repository is None:
        print("zeroserve serve: --model-repository is required (or --demo)", file=sys.stderr)
        return 2
    if args.load_model and args.model_control_mode != "explicit":
        print("zeroserve serve: --load-model needs --model-control-mode explicit", file=sys.stderr)
        return 2
    overrides: dict[str, object] = {}
    if args.http_max_input_size is not None:
        overrides["max_input_bytes"] = args.http_max_input_size
    if args.exit_timeout_secs is not None:
        overrides["exit_timeout_s"] = args.exit_timeout_secs
    if args.grpc_port is not None:
        overrides["grpc_port"] = args.grpc_port
    if args.repository_poll_secs is not None:
        overrides["repository_poll_s"] = args.repository_poll_secs
    if args.id is not None:
        overrides["server_id"] = args.id
    if args.cache_dir is not None:
        overrides["cache_dir"] = args.cache_dir
    try:
        overrides.update(cache_config_overrides(args.cache_config))
        overrides.update(trace_config_overrides(args.trace_config))
    except ValueError as exc:
        print(f"zeroserve serve: {exc}", file=sys.stderr)
        return 2
    try:
        settings = DataPlaneSettings(
            model_repository=repository,
            host=args.host,
            http_port=args.http_port,
            model_control_mode=ModelControlMode(args.model_control_mode),
            load_models=tuple(args.load_model),
            **overrides,  # type: ignore[arg-type]
        )
    except ValidationError as exc:
        print(f"zeroserve serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    if "://" not in settings.model_repository and not Path(settings.model_repository).is_dir():
        print(
            f"zeroserve serve: model repository {settings.model_repository} is not a folder",
            file=sys.stderr,
        )
        return 2
    from data_plane.storage import StorageError
    from foundation.serving import ServerStartError

    try:
        run(settings)
    except StorageError as exc:
        print(f"zeroserve serve: {exc.message}", file=sys.stderr)
        return 2
    except ServerStartError as exc:
        print(f"zeroserve serve: {exc.message}", file=sys.stderr)
        return _START_FAILURE
    except OSError as exc:  # the port is in use, or the address is not this machine's
        print(f"zeroserve serve: {exc}", file=sys.stderr)
        return 1
    return 0


def _platform_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``up`` and ``control-plane``."""
    parser.add_argument("--admin-host", default=None, help="admin API address (loopback)")
    parser.add_argument("--admin-port", type=int, default=None, help="admin API port (8081)")
    parser.add_argument(
        "--state", default=None, help="state store: memory (default) or redis://host:port/db"
    )
    parser.add_argument("--backend", choices=["local", "knative"], default=None)
    parser.add_argument("--cache-dir", type=Path, default=None, help="node cache shared by workers")
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument(
        "--warm-workers", type=int, default=None, help="empty workers kept ready for cold starts"
    )
    parser.add_argument(
        "--allow-storage",
        action="append",
        default=[],
        metavar="ROOT",
        help="storage root models may come from (s3://bucket/prefix or /dir; repeatable)",
    )
    parser.add_argument("--worker-log-dir", type=Path, default=None)
    parser.add_argument("--log-level", default="info")


def _control_plane_settings(args: argparse.Namespace) -> ControlPlaneSettings:
    from control_plane.settings import ControlPlaneSettings

    overrides: dict[str, object] = {}
    for option, field in (
        ("admin_host", "admin_host"),
        ("admin_port", "admin_port"),
        ("state", "state_url"),
        ("backend", "backend"),
        ("cache_dir", "cache_dir"),
        ("max_workers", "max_workers"),
        ("warm_workers", "warm_workers"),
        ("worker_log_dir", "worker_log_dir"),
    ):
        value = getattr(args, option)
        if value is not None:
            overrides[field] = value
    settings = ControlPlaneSettings(**overrides)  # type: ignore[arg-type]
    if args.allow_storage:
        allowed = (*settings.allowed_storage, *args.allow_storage)
        settings = settings.model_copy(update={"allowed_storage": allowed})
    return settings


def _up_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser(
        "up", help="run the platform on this machine: activator, control plane, local workers"
    )
    up.add_argument("--host", default=None, help="public (activator) address; 127.0.0.1")
    up.add_argument("--port", type=int, default=None, help="public (activator) port; 8080")
    up.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="public gRPC port (Triton's inference service for every model); 0, the "
        "default, serves no gRPC",
    )
    _platform_arguments(up)
    up.add_argument(
        "--demo", action="store_true", help="register a generated demo model (scaled to zero)"
    )
    up.set_defaults(handler=_up)


def _up(args: argparse.Namespace) -> int:
    from activator.settings import ActivatorSettings
    from foundation.serving import ServerStartError
    from zeroserve.platform import ensure_admin_token, serve

    try:
        settings, generated = ensure_admin_token(_control_plane_settings(args))
        if "allow_model_code" not in settings.model_fields_set:
            # One machine, its own user: models are code as in `zeroserve serve`. A cluster
            # control plane keeps the default (off) until its operator allows it.
            settings = settings.model_copy(update={"allow_model_code": True})
        overrides: dict[str, object] = {"state_url": settings.state_url}
        if args.host is not None:
            overrides["host"] = args.host
        if args.port is not None:
            overrides["port"] = args.port
        if args.grpc_port is not None:
            overrides["grpc_port"] = args.grpc_port
        activator_settings = ActivatorSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        print(f"zeroserve up: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    if generated:
        assert settings.admin_token is not None
        print(
            f"zeroserve: admin token (set ZEROSERVE_ADMIN_TOKEN to choose one): "
            f"{settings.admin_token.get_secret_value()}",
            flush=True,
        )
    try:
        return serve(settings, activator_settings, demo=args.demo)
    except ServerStartError as exc:
        print(f"zeroserve up: {exc.message}", file=sys.stderr)
        return _START_FAILURE
    except OSError as exc:
        print(f"zeroserve up: {exc}", file=sys.stderr)
        return 1


def _control_plane_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "control-plane",
        help="run the control plane alone (cluster mode: state in Redis, activators apart)",
    )
    _platform_arguments(parser)
    parser.set_defaults(handler=_control_plane)


def _control_plane(args: argparse.Namespace) -> int:
    from foundation.errors import ZeroserveError
    from foundation.serving import ServerStartError
    from zeroserve.platform import serve

    try:
        settings = _control_plane_settings(args)
        knative = None
        if settings.backend == "knative":
            from control_plane.backends.knative.settings import KnativeSettings

            knative = KnativeSettings()
    except ValidationError as exc:
        print(f"zeroserve control-plane: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    if settings.admin_token is None:
        print("zeroserve control-plane: set ZEROSERVE_ADMIN_TOKEN", file=sys.stderr)
        return 2
    try:
        return serve(settings, None, knative=knative)
    except ServerStartError as exc:
        print(f"zeroserve control-plane: {exc.message}", file=sys.stderr)
        return _START_FAILURE
    except OSError as exc:
        print(f"zeroserve control-plane: {exc}", file=sys.stderr)
        return 1
    except ZeroserveError as exc:  # e.g. Knative lacks what the pools need: say what
        print(f"zeroserve control-plane: {exc.message}", file=sys.stderr)
        return 2


def _activator_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "activator",
        help="run the activator alone (cluster mode: the public endpoint, state in Redis)",
    )
    parser.add_argument(
        "--state", default=None, help="state store shared with the control plane: redis://..."
    )
    parser.add_argument("--host", default=None, help="public address; 127.0.0.1")
    parser.add_argument("--port", type=int, default=None, help="public port; 8080")
    parser.add_argument(
        "--grpc-port", type=int, default=None, help="public gRPC port; 0, the default, serves none"
    )
    parser.add_argument("--activator-id", default=None, help="default: <hostname>-<pid>")
    parser.add_argument("--log-level", default="info")
    parser.set_defaults(handler=_activator)


def _activator(args: argparse.Namespace) -> int:
    from activator.settings import ActivatorSettings
    from foundation.serving import ServerStartError
    from zeroserve.activator_server import serve

    overrides = {
        key: value
        for key, value in (
            ("state_url", args.state),
            ("host", args.host),
            ("port", args.port),
            ("grpc_port", args.grpc_port),
        )
        if value is not None
    }
    try:
        settings = ActivatorSettings(**overrides)
    except ValidationError as exc:
        print(f"zeroserve activator: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    activator_id = args.activator_id or f"{socket.gethostname()}-{os.getpid()}"
    try:
        return serve(settings, activator_id)
    except ServerStartError as exc:
        print(f"zeroserve activator: {exc.message}", file=sys.stderr)
        return _START_FAILURE
    except OSError as exc:
        print(f"zeroserve activator: {exc}", file=sys.stderr)
        return 1


def _models_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = sub.add_parser("models", help="manage models through the admin API")
    models.add_argument("--url", default=None, help="admin API (ZEROSERVE_ADMIN_URL)")
    models.add_argument("--token", default=None, help="admin token (ZEROSERVE_ADMIN_TOKEN)")
    models.add_argument("--log-level", default="warning")
    actions = models.add_subparsers(dest="action", required=True)
    register = actions.add_parser("register", help="register a model")
    register.add_argument("name")
    register.add_argument("--storage-uri", required=True, help="s3://bucket/prefix or a path")
    register.add_argument("--backend", default=None, help="Triton backend, e.g. onnxruntime")
    register.add_argument("--platform", default=None, help="Triton platform")
    register.add_argument(
        "--config", default=None, help="Triton ModelConfig as JSON, or @file.json"
    )
    register.add_argument("--min-replicas", type=int, default=None, help="0 = scale to zero")
    register.add_argument("--max-replicas", type=int, default=None)
    register.add_argument("--target-concurrency", type=float, default=None)
    register.add_argument("--idle-timeout-s", type=float, default=None)
    register.add_argument(
        "--sleep-after-s", type=float, default=None, help="LLMs: sleep when idle this long"
    )
    register.add_argument("--device", choices=["cpu", "cuda"], default=None)
    register.add_argument("--memory-bytes", type=int, default=None)
    register.add_argument(
        "--bls-model",
        dest="bls_models",
        action="append",
        default=None,
        metavar="NAME",
        help="a model this one calls through BLS, placed with it (repeat for several)",
    )
    actions.add_parser("ls", help="list models")
    for action, text in (
        ("show", "a model and its status"),
        ("rm", "unload and delete a model"),
        ("load", "load a model now"),
        ("unload", "unload a model's replicas"),
    ):
        actions.add_parser(action, help=text).add_argument("name")
    _activations_parser(actions)
    actions.add_parser("workers", help="list workers")
    models.set_defaults(handler=_models)


def _activations_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = actions.add_parser("activations", help="a model's recent cold-start timelines")
    parser.add_argument("name", help="the model")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="follow its activations live (phase, worker, time, bytes fetched) until they end",
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=30.0,
        help="with --watch: how long to wait for an activation to start when none is running",
    )


def _models(args: argparse.Namespace) -> int:
    from control_plane.api.client import run
    from control_plane.settings import AdminClientSettings

    overrides: dict[str, object] = {}
    if args.url is not None:
        overrides["url"] = args.url
    if args.token is not None:
        overrides["token"] = args.token
    settings = AdminClientSettings(**overrides)  # type: ignore[arg-type]
    if args.action == "activations" and args.watch:
        from control_plane.api.watch import watch

        return watch(settings, args.name, wait_s=args.wait_s, out=sys.stdout, err=sys.stderr)
    body: dict[str, object] | None = None
    if args.action == "register":
        try:
            body = registration_body(args)
        except ValueError as exc:
            print(f"zeroserve models register: {exc}", file=sys.stderr)
            return 2
    return run(
        args.action,
        settings,
        name=getattr(args, "name", None),
        body=body,
        out=sys.stdout,
        err=sys.stderr,
    )


def registration_body(args: argparse.Namespace) -> dict[str, object]:
    """The admin API's registration body for ``zeroserve models register``'s arguments.

    Raises ValueError when ``--config`` is not JSON."""
    body: dict[str, object] = {"name": args.name, "storage_uri": args.storage_uri}
    for option in ("backend", "platform", "bls_models"):
        if getattr(args, option) is not None:
            body[option] = getattr(args, option)
    if args.config is not None:
        text = args.config
        if text.startswith("@"):
            text = Path(text[1:]).read_text(encoding="utf-8")
        try:
            body["config"] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--config is not JSON: {exc}") from None
    scaling = {
        key: getattr(args, key)
        for key in (
            "min_replicas",
            "max_replicas",
            "target_concurrency",
            "idle_timeout_s",
            "sleep_after_s",
        )
        if getattr(args, key) is not None
    }
    if scaling:
        body["scaling"] = scaling
    resources = {
        key: getattr(args, key)
        for key in ("device", "memory_bytes")
        if getattr(args, key) is not None
    }
    if resources:
        body["resources"] = resources
    return body


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _up_parser(sub)
    _control_plane_parser(sub)
    _activator_parser(sub)
    _models_parser(sub)
    from zeroserve.bench.args import add_bench_parser

    add_bench_parser(sub).set_defaults(handler=_bench)
    return parser


def _bench(args: argparse.Namespace) -> int:
    # Imported here so that building the parser stays cheap.
    from zeroserve.bench.runner import main

    return main(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
