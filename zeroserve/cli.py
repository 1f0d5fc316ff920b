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

from zeroserve.local_paths import absolute_local, absolute_state_url, default_state_path

if TYPE_CHECKING:
    from control_plane.settings import AdminClientSettings, ControlPlaneSettings
    from zeroserve.credentials import StoreOutcome

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
    serve.add_argument("--host", default="127.0.0.1", help="address the servers listen on")
    serve.add_argument("--http-port", type=int, default=8000, help="port of the HTTP server")
    serve.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="port of the gRPC server (default 8001, as Triton's); 0 serves no gRPC",
    )
    serve.add_argument(
        "--grpc-frontend",
        choices=["aio", "h2corn"],
        default=None,
        help="what carries gRPC: h2corn (the default: Rust HTTP/2, less CPU a call) or aio "
        "(grpcio's server, for its keepalive settings); see docs/operating/grpc.md",
    )
    _grpc_tls_arguments(serve)
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="port serving /metrics alone (default 8002, as Triton's); 0 keeps /metrics on "
        "the HTTP port only, where it is served either way",
    )
    serve.add_argument(
        "--allow-metrics",
        type=_triton_bool,
        default=None,
        metavar="true|false",
        help="serve /metrics at all (default true, as Triton's)",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        default="none",
        help="as Triton's: none loads every model at start; explicit loads what "
        "--load-model and the repository API ask for; poll follows the repository's changes",
    )
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
    serve.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where models fetched from S3 are kept (default ~/.cache/zeroserve)",
    )
    serve.add_argument(
        "--http-max-input-size", type=int, default=None, help="largest request body, bytes"
    )
    serve.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=None,
        help="seconds in-flight requests may take to finish at shutdown (default 30)",
    )
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
    serve.add_argument(
        "--log-level",
        default="info",
        help="how much the process logs: debug, info, warning or error",
    )
    serve.set_defaults(handler=_serve)


def _grpc_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """Triton's gRPC TLS flags, for a command serving gRPC."""
    parser.add_argument(
        "--grpc-use-ssl",
        type=_triton_bool,
        nargs="?",
        const=True,
        default=None,
        metavar="true|false",
        help="serve gRPC over TLS only, with --grpc-server-cert and --grpc-server-key",
    )
    parser.add_argument(
        "--grpc-use-ssl-mutual",
        type=_triton_bool,
        nargs="?",
        const=True,
        default=None,
        metavar="true|false",
        help="gRPC over mutual TLS: clients need a certificate signed by --grpc-root-cert "
        "(implies --grpc-use-ssl, as Triton's)",
    )
    parser.add_argument(
        "--grpc-server-cert",
        type=Path,
        default=None,
        help="PEM file: the gRPC server's certificate",
    )
    parser.add_argument(
        "--grpc-server-key", type=Path, default=None, help="PEM file: the gRPC server's key"
    )
    parser.add_argument(
        "--grpc-root-cert",
        type=Path,
        default=None,
        help="PEM file: the CA certificates client certificates must chain to (mutual TLS)",
    )


def _grpc_tls_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The settings :func:`_grpc_tls_arguments`' flags give, where given."""
    overrides: dict[str, object] = {
        field: value
        for field, value in (
            ("grpc_use_ssl", args.grpc_use_ssl),
            ("grpc_use_ssl_mutual", args.grpc_use_ssl_mutual),
            ("grpc_server_cert", args.grpc_server_cert),
            ("grpc_server_key", args.grpc_server_key),
            ("grpc_root_cert", args.grpc_root_cert),
        )
        if value is not None
    }
    if args.grpc_use_ssl_mutual and args.grpc_use_ssl is None:
        overrides["grpc_use_ssl"] = True
    return overrides


def _triton_bool(text: str) -> bool:
    """A boolean flag value as Triton's command line reads it."""
    lowered = text.lower()
    if lowered in ("true", "1", "on", "yes"):
        return True
    if lowered in ("false", "0", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


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
    if args.metrics_port is not None:
        overrides["metrics_port"] = args.metrics_port
    if args.allow_metrics is not None:
        overrides["allow_metrics"] = args.allow_metrics
    if args.grpc_frontend is not None:
        overrides["grpc_frontend"] = args.grpc_frontend
    overrides.update(_grpc_tls_overrides(args))
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
        "--state",
        default=None,
        help="state store: sqlite:///PATH (up's default: a file in your data folder, "
        "~/.local/share/zeroserve/state.db), memory (forgotten on exit) or "
        "redis://host:port/db",
    )
    parser.add_argument(
        "--backend",
        choices=["local", "knative"],
        default=None,
        help="where workers run: local processes (default) or Knative pods in a cluster",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="node cache shared by workers")
    parser.add_argument(
        "--max-workers", type=int, default=None, help="most workers at once (default 4)"
    )
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
    parser.add_argument(
        "--worker-log-dir",
        type=Path,
        default=None,
        help="folder for local workers' logs, a file each (default: this process's stderr)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        help="how much the process logs: debug, info, warning or error",
    )


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
    cwd = Path.cwd()
    state_url = absolute_state_url(settings.state_url, cwd)
    if state_url != settings.state_url:
        settings = settings.model_copy(update={"state_url": state_url})
    if args.allow_storage:
        added = (absolute_local(root, cwd) for root in args.allow_storage)
        allowed = (*settings.allowed_storage, *added)
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
    _grpc_tls_arguments(up)
    _platform_arguments(up)
    up.add_argument(
        "--demo",
        action="store_true",
        help="register a generated demo model (scaled to zero) and create an API key for it",
    )
    up.add_argument(
        "--auth",
        choices=["keys", "off"],
        default=None,
        help="keys (default): model endpoints need an API key; off: anyone may call them",
    )
    up.set_defaults(handler=_up)


def _up(args: argparse.Namespace) -> int:
    from activator.settings import ActivatorSettings
    from foundation.serving import ServerStartError
    from zeroserve.platform import ensure_admin_token, serve

    try:
        settings, generated = ensure_admin_token(_control_plane_settings(args))
        if "state_url" not in settings.model_fields_set:
            # Embedded, registrations outlive the process unless memory is asked for; the
            # standalone control plane keeps memory, its cluster state being Redis.
            path = default_state_path(os.environ, Path.home())
            settings = settings.model_copy(update={"state_url": f"sqlite:///{path}"})
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
        if args.auth is not None:
            overrides["auth"] = args.auth
        overrides.update(_grpc_tls_overrides(args))
        activator_settings = ActivatorSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        print(f"zeroserve up: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    assert settings.admin_token is not None
    token = settings.admin_token.get_secret_value()

    def remember(admin_url: str) -> None:
        # Once the admin API listens, so that a platform that failed to start never
        # replaces the token of one already running at the same URL. An admin API bound to
        # every address is reached, from this machine, on loopback.
        for wildcard, loopback in (("//0.0.0.0:", "//127.0.0.1:"), ("//[::]:", "//[::1]:")):
            admin_url = admin_url.replace(wildcard, loopback)
        _store_for_cli("zeroserve up", admin_url, token, generated=generated)

    try:
        return serve(settings, activator_settings, demo=args.demo, on_started=remember)
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
    parser.add_argument(
        "--auth",
        choices=["keys", "off"],
        default=None,
        help="keys (default): model endpoints need an API key; off: anyone may call them",
    )
    parser.add_argument(
        "--activator-id",
        default=None,
        help="this activator's name among the others (default: <hostname>-<pid>)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        help="how much the process logs: debug, info, warning or error",
    )
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
            ("auth", args.auth),
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
    models = sub.add_parser(
        "models",
        help="manage models through the admin API",
        description="Register, change, load, unload and inspect models through the admin API "
        "of a running platform. Where it is and its token come from --url and --token, else "
        "ZEROSERVE_ADMIN_URL and ZEROSERVE_ADMIN_TOKEN, else what `zeroserve login` (or "
        "`zeroserve up`) stored.",
    )
    admin_options(models)
    models.add_argument("--log-level", default="warning", help="how much the client logs")
    actions = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    register = actions.add_parser("register", help="register a model")
    register.add_argument("name", help="the model's name in URLs")
    register.add_argument(
        "--storage-uri",
        required=True,
        help="where the model's folder is: s3://bucket/prefix or a path on this machine",
    )
    _model_fields(register, is_change=False)
    register.add_argument(
        "--dry-run",
        action="store_true",
        help="check the stored model as a registration would, and register nothing",
    )
    admin_options(register, nested=True)
    _update_parser(actions)
    admin_options(actions.add_parser("ls", help="list models"), nested=True)
    for action, text in (
        ("show", "a model and its status"),
        ("rm", "unload and delete a model"),
        ("load", "load a model now"),
        ("unload", "unload a model's replicas"),
    ):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("name", help="the model's name")
        admin_options(parser, nested=True)
    _activations_parser(actions)
    admin_options(actions.add_parser("workers", help="list workers"), nested=True)
    models.set_defaults(handler=_models)


def _activations_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = actions.add_parser("activations", help="a model's recent cold-start timelines")
    parser.add_argument("name", help="the model")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="follow its activations live (phase, worker, time, bytes fetched) until they end; "
        "-o json prints each change as one JSON document a line, -o yaml as one YAML document",
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=30.0,
        help="with --watch: how long to wait for an activation to start when none is running",
    )
    admin_options(parser, nested=True)


def _models(args: argparse.Namespace) -> int:
    from control_plane.api.client import run

    settings = admin_settings(args, f"zeroserve models {args.action}")
    if settings is None:
        return 2
    if args.action == "activations" and args.watch:
        from control_plane.api.watch import watch

        return watch(
            settings,
            args.name,
            wait_s=args.wait_s,
            out=sys.stdout,
            err=sys.stderr,
            output=args.output,
        )
    body: dict[str, object] | None = None
    if args.action in ("register", "update"):
        try:
            body = registration_body(args) if args.action == "register" else update_body(args)
        except ValueError as exc:
            print(f"zeroserve models {args.action}: {exc}", file=sys.stderr)
            return 2
    return run(
        args.action,
        settings,
        name=getattr(args, "name", None),
        body=body,
        out=sys.stdout,
        err=sys.stderr,
        output=args.output,
        dry_run=getattr(args, "dry_run", False),
    )


def registration_body(args: argparse.Namespace) -> dict[str, object]:
    """The admin API's registration body for ``zeroserve models register``'s arguments.

    Raises ValueError when ``--config`` is not JSON."""
    # The platform may run elsewhere than this command: a relative folder is the caller's.
    storage_uri = None if args.storage_uri is None else absolute_local(args.storage_uri, Path.cwd())
    body: dict[str, object] = {"name": args.name, "storage_uri": storage_uri}
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
            "policy",
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


def _model_fields(parser: argparse.ArgumentParser, *, is_change: bool) -> None:
    """The registration's fields beside name and storage, for ``models register`` and
    ``models update``; ``is_change``: an option not given stays as it is, so the help names
    no default."""

    def default(text: str) -> str:
        return "" if is_change else f" (default {text})"

    parser.add_argument("--backend", default=None, help="Triton backend, e.g. onnxruntime")
    parser.add_argument("--platform", default=None, help="Triton platform")
    parser.add_argument("--config", default=None, help="Triton ModelConfig as JSON, or @file.json")
    for option, kind, text in (
        ("--min-replicas", int, "0 = scale to zero"),
        ("--max-replicas", int, "most replicas at once" + default("1")),
        (
            "--target-concurrency",
            float,
            "requests in flight per replica the autoscaler aims for" + default("8"),
        ),
        (
            "--idle-timeout-s",
            float,
            "seconds without a request before the model unloads" + default("300"),
        ),
        ("--sleep-after-s", float, "LLMs: sleep when idle this long (0: never)"),
    ):
        parser.add_argument(option, type=kind, default=None, help=text)
    parser.add_argument(
        "--keep-alive",
        dest="policy",
        choices=["fixed", "adaptive"],
        default=None,
        help="keep-alive policy: fixed (idle-timeout) or adaptive (learned, pre-warms)",
    )
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default=None, help="where it runs" + default("cpu")
    )
    parser.add_argument(
        "--memory-bytes",
        type=int,
        default=None,
        help="memory one loaded replica takes, which places it" + default("0: unknown"),
    )
    parser.add_argument(
        "--bls-model",
        dest="bls_models",
        action="append",
        default=None,
        metavar="NAME",
        help=(
            "the models it calls through BLS, all of them"
            if is_change
            else "a model this one calls through BLS, placed with it"
        )
        + " (repeat for several)",
    )


def _update_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    update = actions.add_parser(
        "update",
        help="change a registered model (options not given stay as they are)",
        description="Change a registered model through the admin API (PATCH): options not "
        "given stay as they are. A new storage URI, config, backend, platform or resources "
        "reload its replicas in place; scaling applies from the autoscaler's next decision.",
    )
    update.add_argument("name", help="the model's name")
    update.add_argument("--storage-uri", default=None, help="a new place for its folder")
    _model_fields(update, is_change=True)
    admin_options(update, nested=True)


def update_body(args: argparse.Namespace) -> dict[str, object]:
    """The admin API's PATCH body for ``zeroserve models update``'s arguments.

    Raises ValueError when ``--config`` is not JSON or when nothing would change."""
    body = registration_body(args)
    del body["name"]
    if body["storage_uri"] is None:
        del body["storage_uri"]
    if not body:
        raise ValueError("nothing to change: pass an option (see --help)")
    return body


def admin_options(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    """``--url``, ``--token`` and ``-o`` for a command that calls the admin API.

    ``nested`` for its subcommands: the options are accepted after the subcommand as well
    (``zeroserve models ls -o json``), without overwriting a value given before it.
    """
    unset = argparse.SUPPRESS if nested else None
    parser.add_argument(
        "--url",
        default=unset,
        help="the admin API, e.g. http://127.0.0.1:8081 (default: ZEROSERVE_ADMIN_URL, "
        "else the one `zeroserve login` or `zeroserve up` stored)",
    )
    parser.add_argument(
        "--token",
        default=unset,
        help="the admin token (default: ZEROSERVE_ADMIN_TOKEN, else the one stored for the "
        "URL by `zeroserve login` or `zeroserve up`)",
    )
    from foundation.output import add_output_option

    add_output_option(parser, default=argparse.SUPPRESS if nested else "table")


def admin_settings(args: argparse.Namespace, where: str) -> AdminClientSettings | None:
    """Where the admin API is and its token: ``--url``/``--token``, else
    ``ZEROSERVE_ADMIN_URL``/``ZEROSERVE_ADMIN_TOKEN``, else the stored credentials.

    None (after saying why on stderr, prefixed with ``where``) when they cannot be read."""
    from pydantic import SecretStr

    from control_plane.settings import AdminClientSettings
    from zeroserve.credentials import CredentialsError, config_path, read_credentials

    overrides: dict[str, object] = {}
    if getattr(args, "url", None) is not None:
        overrides["url"] = args.url
    if getattr(args, "token", None) is not None:
        overrides["token"] = args.token
    try:
        settings = AdminClientSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        print(f"{where}: invalid settings:\n{exc}", file=sys.stderr)
        return None
    given = settings.model_fields_set
    if {"url", "token"} <= given:
        return settings
    try:
        stored = read_credentials(config_path(os.environ))
    except CredentialsError as exc:
        print(
            f"{where}: cannot read the stored credentials, {exc.message}: fix or delete "
            "that file (then `zeroserve login`), or pass --url and --token",
            file=sys.stderr,
        )
        return None
    update: dict[str, object] = {}
    if "url" not in given and stored.current is not None:
        update["url"] = stored.current
    token = stored.token_for(str(update.get("url", settings.url)))
    if "token" not in given and token is not None:
        update["token"] = SecretStr(token)
    return settings.model_copy(update=update)


def _login_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    login = sub.add_parser(
        "login",
        help="store the admin API's URL and token for the commands that follow",
        description="Check the admin token against the admin API, then store the URL and the "
        "token in a file only you can read ($XDG_CONFIG_HOME/zeroserve/config.json, else "
        "~/.config/zeroserve/config.json). Later commands use them unless --url, --token or "
        "ZEROSERVE_ADMIN_* say otherwise. Without --token the token is read from the "
        "terminal (not echoed) or from standard input.",
    )
    login.add_argument(
        "--url",
        default=None,
        help="the admin API (default: ZEROSERVE_ADMIN_URL, else the stored one, else "
        "http://127.0.0.1:8081)",
    )
    login.add_argument(
        "--token",
        default=None,
        help="the admin token (default: ZEROSERVE_ADMIN_TOKEN, else asked for); on a shared "
        "machine prefer standard input, which other users' `ps` does not show",
    )
    login.add_argument("--log-level", default="warning", help="how much the client logs")
    from foundation.output import add_output_option

    # What it stored (never the token): a sentence, or a document for a script.
    add_output_option(login)
    login.set_defaults(handler=_login)


def _login(args: argparse.Namespace) -> int:
    import httpx
    from pydantic import SecretStr

    from control_plane.api.client import AdminApiError, AdminClient

    where = "zeroserve login"
    settings = admin_settings(args, where)
    if settings is None:
        return 2
    # The token stored for the URL before is not the one to log in with (login is how a
    # user replaces it): --token, else the environment's, else asked for.
    token = args.token
    if token is None:
        from control_plane.settings import AdminClientSettings

        env = AdminClientSettings().token
        token = env.get_secret_value() if env is not None else _read_token(settings.url)
    if not token:
        print(f"{where}: no token given: pass --token, or type it when asked", file=sys.stderr)
        return 2
    checked = settings.model_copy(update={"token": SecretStr(token)})
    client = AdminClient(checked)
    try:
        client.call("GET", "/models")
    except AdminApiError as exc:
        advice = ": check the token (the platform's ZEROSERVE_ADMIN_TOKEN)"
        print(f"{where}: {settings.url} refused it, {exc}{advice}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(
            f"{where}: cannot reach the admin API at {settings.url} ({exc}): pass --url",
            file=sys.stderr,
        )
        return 1
    finally:
        client.close()
    stored = _store_for_cli(where, settings.url, token, generated=False, output=args.output)
    return 0 if stored else 1


def _read_token(url: str) -> str:
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass(f"admin token for {url}: ").strip()
    return sys.stdin.readline().strip()


def _store_for_cli(
    where: str, url: str, token: str, *, generated: bool, output: str = "table"
) -> bool:
    """Stores ``token`` for ``url`` as the command line's default and says what changed
    (never the token), as sentences or, with ``output`` json or yaml, as a document; False,
    said on stderr, when the file cannot be written."""
    from zeroserve.credentials import CredentialsError, config_path, store_credentials

    try:
        outcome = store_credentials(config_path(os.environ), url, token)
    except CredentialsError as exc:
        hint = " Set ZEROSERVE_ADMIN_TOKEN to choose the token instead." if generated else ""
        print(f"{where}: cannot store the admin token, {exc.message}.{hint}", file=sys.stderr)
        return False
    if output == "table":
        print(_stored_message(outcome), flush=True)
    else:
        from foundation.output import emit

        document = {
            "url": outcome.url,
            "path": str(outcome.path),
            "replaced_token": outcome.replaced_token,
            "previous_default": outcome.previous_current,
        }
        emit(document, (), output)
    return True


def _stored_message(outcome: StoreOutcome) -> str:
    lines = [
        f"zeroserve: admin token for {outcome.url} stored in {outcome.path}; "
        "`zeroserve models ls` and the other commands use it"
    ]
    if outcome.replaced_token:
        lines.append(f"zeroserve: it replaces the token stored for {outcome.url} before")
    if outcome.previous_current is not None:
        lines.append(
            f"zeroserve: the default admin API was {outcome.previous_current}; its token is "
            f"kept: pass --url {outcome.previous_current} to use it"
        )
    return "\n".join(lines)


_DESCRIPTION = """\
Serverless inference: Triton-compatible model servers that scale to zero.

Start here:
  zeroserve up --demo              run the platform on this machine, with a demo model
  zeroserve models ls              list the models (the admin token is stored by `up`)
  zeroserve models register NAME --storage-uri PATH
  zeroserve serve --model-repository DIR   one inference server, as tritonserver

Run `zeroserve COMMAND --help` for a command's options.
"""


def _keys_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser(
        "keys",
        help="manage API keys for the model endpoints",
        description="Create, list, show and revoke the API keys callers send as "
        "`Authorization: Bearer <key>` (gRPC: `authorization` metadata). A key is shown once, "
        "when it is created; the platform keeps only its hash.",
    )
    admin_options(keys)
    keys.add_argument(
        "--log-level",
        default="warning",
        help="how much the command logs: debug, info, warning or error",
    )
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a key (printed once, never again)")
    create.add_argument("name", help="a label for whoever gets the key")
    create.add_argument(
        "--model",
        dest="models",
        action="append",
        default=None,
        metavar="NAME",
        help="a model (or shell pattern, e.g. 'resnet-*') the key may call; repeat for "
        "several; default: every model",
    )
    create.add_argument(
        "--expires-in",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the key stops working this many seconds from now (default: never)",
    )
    create.add_argument("--rps", type=float, default=None, help="requests per second")
    create.add_argument("--burst", type=int, default=None, help="requests at once (with --rps)")
    create.add_argument("--max-in-flight", type=int, default=None, help="requests at once")
    create.add_argument(
        "--activations-per-hour", type=int, default=None, help="cold starts it may trigger"
    )
    admin_options(create, nested=True)
    admin_options(actions.add_parser("ls", help="list keys (never their secrets)"), nested=True)
    for action, text in (("show", "one key"), ("revoke", "revoke a key on every activator")):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("key_id", help="the key's public id (zeroserve keys ls)")
        admin_options(parser, nested=True)
    keys.set_defaults(handler=_keys)


def _keys(args: argparse.Namespace) -> int:
    from control_plane.api.client import run_keys

    settings = admin_settings(args, f"zeroserve keys {args.action}")
    if settings is None:
        return 2
    body: dict[str, object] | None = None
    if args.action == "create":
        limits = {
            field: getattr(args, option)
            for option, field in (
                ("rps", "requests_per_s"),
                ("burst", "burst"),
                ("max_in_flight", "max_in_flight"),
                ("activations_per_hour", "activations_per_hour"),
            )
            if getattr(args, option) is not None
        }
        body = {"name": args.name, "models": args.models or ["*"], "limits": limits}
        if args.expires_in is not None:
            body["expires_in_s"] = args.expires_in
    return run_keys(
        args.action,
        settings,
        key_id=getattr(args, "key_id", None),
        body=body,
        output=args.output,
        out=sys.stdout,
        err=sys.stderr,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeroserve",
        description=_DESCRIPTION,
        # The description's lines are laid out by hand (the commands to start with).
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _serve_parser(sub)
    _up_parser(sub)
    _control_plane_parser(sub)
    _activator_parser(sub)
    _models_parser(sub)
    _login_parser(sub)
    _keys_parser(sub)
    from zeroserve.bench.args import add_bench_parser

    add_bench_parser(sub).set_defaults(handler=_bench)
    from zeroserve.simulate import add_simulate_parser

    add_simulate_parser(sub).set_defaults(handler=_simulate)
    return parser


def _simulate(args: argparse.Namespace) -> int:
    from zeroserve.simulate import main

    admin = None
    if args.load_times_from_api:
        admin = admin_settings(args, "zeroserve simulate --load-times-from-api")
        if admin is None:
            return 2
    return main(args, admin=admin)


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
    _configure_access_log()
    try:
        return int(args.handler(args))
    except BrokenPipeError:
        # The reader went away (`zeroserve models ls | head`): not an error of ours, and
        # Python would report it again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _configure_access_log() -> None:
    """Access-log lines go to stderr as they are (each carries its own time, and a JSON line
    must stay JSON), whatever ``--log-level``: turning them off is a setting of their own."""
    from activator.access_log import ACCESS_LOGGER

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger(ACCESS_LOGGER)
    access.handlers[:] = [handler]
    access.setLevel(logging.INFO)
    access.propagate = False


if __name__ == "__main__":
    sys.exit(main())
