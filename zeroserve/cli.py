"""``zeroserve <command>``: argument parsing only; each command hands off to its component."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run a standalone inference server over a model repository (like tritonserver)",
    )
    serve.add_argument("--model-repository", type=Path, help="Triton-layout model folder")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--model-control-mode", choices=["none", "explicit"], default="none")
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
        "--demo",
        action="store_true",
        help="generate a demo ONNX model into the repository folder (./demo-models by default)",
    )
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from data_plane.server import run
    from data_plane.settings import DataPlaneSettings, ModelControlMode

    repository: Path | None = args.model_repository
    if args.demo:
        from data_plane.demo import DEMO_MODEL, write_demo_repository

        repository = repository or Path("demo-models")
        write_demo_repository(repository)
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
    if args.cache_dir is not None:
        overrides["cache_dir"] = args.cache_dir
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
    if not settings.model_repository.is_dir():
        print(
            f"zeroserve serve: model repository {settings.model_repository} is not a folder",
            file=sys.stderr,
        )
        return 2
    run(settings)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
