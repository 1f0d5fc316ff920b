"""``zeroserve bench``: prepare the requests, check one, run every level, report.

Everything that costs time per request is settled before the clock starts: the model's
metadata (and configuration, where the server serves Triton's ``/config``) gives the inputs,
the request bytes are built, and one request is sent and its answer checked, so that a wrong
model name or input fails at once with the server's own message instead of as a table of
errors. Then each level runs on one event loop (uvloop when installed) with the garbage
collector paused (:mod:`zeroserve.bench.level`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from zeroserve.bench import inputs as inputs_module, report
from zeroserve.bench.args import BenchConfig, config_from_args
from zeroserve.bench.client import Endpoint, EndpointError, fetch
from zeroserve.bench.closed_loop import ClosedLoop, LoadPlan
from zeroserve.bench.level import measure, run_on_event_loop
from zeroserve.bench.open_loop import OpenLoop
from zeroserve.bench.payload import (
    Body,
    http_request,
    infer_path,
    openai_body,
    openai_path,
    v2_body,
)
from zeroserve.bench.plot import PlotUnavailableError
from zeroserve.bench.progress import REDRAW_S, Progress
from zeroserve.bench.sse import StreamMeter
from zeroserve.bench.stats import BenchRun, LevelResult

logger = logging.getLogger(__name__)


class BenchError(Exception):
    """The run cannot start or go on: the message says why, for the user."""


@dataclass(frozen=True)
class _Prepared:
    endpoint: Endpoint
    path: str
    requests: tuple[bytes, ...]
    inputs: list[dict[str, Any]]


def run_bench(
    config: BenchConfig,
    *,
    err: TextIO | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
) -> BenchRun:
    """Run every level of ``config`` against its server; raises :class:`BenchError`."""
    started_utc = datetime.now(UTC).isoformat(timespec="seconds")
    prepared = _prepare(config)
    run = BenchRun(
        config=config,
        started_utc=started_utc,
        path=prepared.path,
        request_bytes=len(prepared.requests[0]),
        distinct_requests=len(prepared.requests),
        inputs=prepared.inputs,
        client=_client_description(),
    )
    progress = Progress.for_stream(err or sys.stderr, config.progress)
    plan = LoadPlan(
        endpoint=prepared.endpoint,
        requests=prepared.requests,
        warmup_s=config.warmup_s,
        duration_s=config.duration_s,
        timeout_s=config.timeout_s,
        connect_timeout_s=config.connect_timeout_s,
        batch_size=config.batch_size,
        is_stream=config.is_stream,
    )

    async def levels() -> None:
        for index, level in enumerate(config.levels):
            label = f"rate={level:g}/s" if config.mode == "rate" else f"c={level:g}"
            progress.level_started(
                index, len(config.levels), label, config.warmup_s + config.duration_s
            )
            result = await _run_level(config, plan, level, index, progress)
            progress.level_done(result)
            run.levels.append(result)
            if on_level is not None:
                on_level(result)

    _, run.client["event_loop"] = run_on_event_loop(levels)
    return run


async def _run_level(
    config: BenchConfig, plan: LoadPlan, level: float, index: int, progress: Progress
) -> LevelResult:
    loop: ClosedLoop | OpenLoop
    if config.mode == "rate":
        # A different seed per level, the same ones every run with the same --seed.
        seed = config.seed * 1_000_003 + index
        loop = OpenLoop(plan, level, seed=seed, max_connections=config.max_connections)
    else:
        loop = ClosedLoop(plan, int(level))
    redraw = asyncio.create_task(_redraw(progress, loop), name="bench-progress")
    try:
        return await measure(loop)
    finally:
        redraw.cancel()
        await asyncio.gather(redraw, return_exceptions=True)


async def _redraw(progress: Progress, loop: ClosedLoop | OpenLoop) -> None:
    if progress.style != "bar":
        return
    while True:
        await asyncio.sleep(REDRAW_S)
        progress.redraw(loop)


def _client_description() -> dict[str, Any]:
    return {
        "event_loop": "",
        "python": platform.python_version(),
        "pid": os.getpid(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "load_average": list(os.getloadavg()),
    }


# -- preparing the requests ----------------------------------------------------------------


def _prepare(config: BenchConfig) -> _Prepared:
    try:
        endpoint = Endpoint.parse(config.url)
    except EndpointError as exc:
        raise BenchError(str(exc)) from None
    if config.is_openai:
        path = openai_path(endpoint.base_path, config.openai_route)
        body = openai_body(
            config.model, route=config.openai_route, prompt=config.prompt,
            max_tokens=config.max_tokens, is_stream=config.is_stream,
        )  # fmt: skip
        check = _check_openai_stream if config.is_stream else _check_openai_answer
        _check(config, endpoint, path, body, check)
        inputs = [{"name": "prompt", "datatype": "BYTES", "shape": [1]}]
        return _Prepared(endpoint, path, (_request(config, endpoint, path, body),), inputs)
    path = infer_path(endpoint.base_path, config.model, config.model_version)
    bodies, inputs = _v2_bodies(config, endpoint)
    _check(config, endpoint, path, bodies[0], _check_v2_answer)
    requests = tuple(_request(config, endpoint, path, body) for body in bodies)
    return _Prepared(endpoint, path, requests, inputs)


def _v2_bodies(config: BenchConfig, endpoint: Endpoint) -> tuple[list[Body], list[dict[str, Any]]]:
    model_path = f"{endpoint.base_path}/v2/models/{config.model}"
    if config.model_version is not None:
        model_path += f"/versions/{config.model_version}"
    metadata = _get_json(config, endpoint, model_path, "model metadata")
    if metadata is None:
        raise BenchError(f"model metadata {model_path} answered no JSON")
    model_config = _get_json(config, endpoint, model_path + "/config", None)
    overrides = dict(config.shapes)
    try:
        specs = inputs_module.parse_metadata(metadata)
        unknown = set(overrides) - {s.name for s in specs}
        if unknown:
            raise inputs_module.InputError(f"--shape names unknown inputs: {sorted(unknown)}")
        is_batched = inputs_module.is_batching(specs, model_config)
        if config.input_data in ("random", "zero"):
            requests = [
                inputs_module.generated_tensors(
                    specs,
                    fill=config.input_data,
                    batch_size=config.batch_size,
                    is_batched=is_batched,
                    overrides=overrides,
                    seed=config.seed,
                )
            ]
        else:
            requests = inputs_module.load_input_data(
                Path(config.input_data),
                specs,
                batch_size=config.batch_size,
                is_batched=is_batched,
                overrides=overrides,
            )
        bodies = [v2_body(tensors, is_binary=config.is_binary) for tensors in requests]
    except inputs_module.InputError as exc:
        raise BenchError(str(exc)) from None
    described = [
        {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in requests[0]
    ]
    return bodies, described


def _request(config: BenchConfig, endpoint: Endpoint, path: str, body: Body) -> bytes:
    return http_request(endpoint.host_header, "POST", path, body, config.headers)


def _get_json(
    config: BenchConfig, endpoint: Endpoint, path: str, what: str | None
) -> dict[str, Any] | None:
    """GET ``path`` as JSON; a failure raises when ``what`` names it, else gives None."""
    try:
        answer = fetch(
            endpoint, "GET", path, headers=dict(config.headers), timeout_s=config.setup_timeout_s
        )
    except OSError as exc:
        raise BenchError(f"cannot reach {config.url}: {exc}") from None
    if answer.status != 200:
        if what is None:
            return None
        raise BenchError(f"{what} ({path}) answered {answer.status}: {_sample(answer.body)}")
    try:
        document = json.loads(answer.body)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        if what is None:
            return None
        raise BenchError(f"{what} ({path}) is not a JSON object: {_sample(answer.body)}")
    return document


def _check(
    config: BenchConfig,
    endpoint: Endpoint,
    path: str,
    body: Body,
    check_answer: Callable[[dict[str, str], bytes], str | None],
) -> None:
    """Send one request before the load; its answer must be a 200 of the expected shape."""
    headers = dict(body.headers) | dict(config.headers)
    try:
        answer = fetch(
            endpoint,
            "POST",
            path,
            body=body.content,
            headers=headers,
            timeout_s=max(config.setup_timeout_s, config.timeout_s),
        )
    except OSError as exc:
        raise BenchError(f"cannot reach {config.url}: {exc}") from None
    if answer.status != 200:
        raise BenchError(
            f"the check request to {path} answered {answer.status}: {_sample(answer.body)}"
        )
    problem = check_answer(answer.headers, answer.body)
    if problem is not None:
        raise BenchError(f"the check request to {path}: {problem}")


def _check_v2_answer(headers: dict[str, str], body: bytes) -> str | None:
    header_length = headers.get("inference-header-content-length")
    head = body[: int(header_length)] if header_length is not None else body
    try:
        document = json.loads(head)
    except ValueError:
        return f"the answer is not V2 JSON: {_sample(body)}"
    if not isinstance(document, dict) or not isinstance(document.get("outputs"), list):
        return f"the answer has no 'outputs': {_sample(body)}"
    return None


def _check_openai_answer(headers: dict[str, str], body: bytes) -> str | None:
    try:
        document = json.loads(body)
    except ValueError:
        return f"the answer is not JSON: {_sample(body)}"
    if not isinstance(document, dict) or not isinstance(document.get("choices"), list):
        return f"the answer has no 'choices': {_sample(body)}"
    return None


def _check_openai_stream(headers: dict[str, str], body: bytes) -> str | None:
    meter = StreamMeter()
    meter.feed(body, 0)
    meter.feed(b"\n", 0)
    if meter.is_error:
        return f"the stream reported an error: {_sample(body)}"
    if not meter.is_done:
        return f"the answer is not an SSE stream ending in 'data: [DONE]': {_sample(body)}"
    if not meter.chunks:
        return f"the stream carried no text: {_sample(body)}"
    return None


def _sample(body: bytes) -> str:
    return body[:300].decode("utf-8", errors="replace").strip() or "(empty body)"


# -- the command -----------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    """``zeroserve bench``: 0 when every level served, 1 when a level got no answer, 2 when
    the run could not start."""
    try:
        config = config_from_args(args, tuple(sys.argv))
    except ValueError as exc:
        print(f"zeroserve bench: {exc}", file=sys.stderr)
        return 2
    try:
        run = run_bench(config)
    except BenchError as exc:
        print(f"zeroserve bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zeroserve bench: interrupted", file=sys.stderr)
        return 130
    print(report.table(run))
    if config.json_out is not None:
        report.write_json(config.json_out, report.to_json(run))
        print(f"results: {config.json_out}")
    if config.plot_out is not None:
        try:
            report.plot_run(run, config.plot_out)
        except PlotUnavailableError as exc:
            print(f"zeroserve bench: {exc}", file=sys.stderr)
            return 2
        print(f"plot: {config.plot_out}")
    return 1 if any(r.ok == 0 for r in run.levels) else 0
