"""Preparing an HTTP run: the model's metadata and configuration over HTTP, the request
bytes (V2 JSON, binary tensors, shared-memory references, or OpenAI bodies), one request
sent and its answer checked, so that a wrong model name or input fails at once with the
server's own message instead of as a table of errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from zeroserve.bench.args import BenchConfig
from zeroserve.bench.client import Endpoint, EndpointError, fetch
from zeroserve.bench.closed_loop import LoadPlan
from zeroserve.bench.payload import (
    Body,
    http_request,
    infer_path,
    openai_body,
    openai_path,
    v2_body,
    v2_shared_memory_body,
)
from zeroserve.bench.prepared import (
    BenchError,
    Prepared,
    describe_inputs,
    model_tensors,
    open_shared_memory,
)
from zeroserve.bench.shared_memory import SharedMemoryError
from zeroserve.bench.sse import StreamMeter


def prepare_http(config: BenchConfig) -> Prepared:
    """The run's requests, checked against the server; raises :class:`BenchError`."""
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
        request = _request(config, endpoint, path, body)
        return Prepared(_plan(config, endpoint, (request,)), path, len(request), inputs)
    path = infer_path(endpoint.base_path, config.model, config.model_version)
    model_path = f"{endpoint.base_path}/v2/models/{quote(config.model, safe='')}"
    if config.model_version is not None:
        model_path += f"/versions/{quote(config.model_version, safe='')}"
    metadata = _get_json(config, endpoint, model_path, "model metadata")
    if metadata is None:
        raise BenchError(f"model metadata {model_path} answered no JSON")
    model_config = _get_json(config, endpoint, model_path + "/config", None)
    max_batch_size = None
    if model_config is not None and "max_batch_size" in model_config:
        max_batch_size = int(model_config["max_batch_size"])
    tensors, is_batched = model_tensors(config, metadata, max_batch_size)
    if config.shared_memory == "none":
        bodies = [v2_body(request, is_binary=config.is_binary) for request in tensors]
        _check(config, endpoint, path, bodies[0], _check_v2_answer)
        requests = tuple(_request(config, endpoint, path, body) for body in bodies)
        plan = _plan(config, endpoint, requests)
        return Prepared(plan, path, len(requests[0]), describe_inputs(tensors[0]))
    registrar = _HttpRegistrar(config, endpoint)
    shm = open_shared_memory(config, registrar, metadata, tensors, is_batched)
    try:
        layout = shm.layout
        table = tuple(
            tuple(
                _request(config, endpoint, path, v2_shared_memory_body(inputs, outputs))
                for inputs in layout.inputs
            )
            for outputs in layout.outputs
        )
        _check(
            config,
            endpoint,
            path,
            v2_shared_memory_body(layout.inputs[0], layout.outputs[0]),
            _check_v2_answer,
        )
    except BaseException:
        shm.close()
        raise
    plan = _plan(config, endpoint, table[0], table)
    return Prepared(plan, path, len(table[0][0]), describe_inputs(tensors[0]), shm)


def _plan(
    config: BenchConfig,
    endpoint: Endpoint,
    requests: tuple[bytes, ...],
    slot_requests: tuple[tuple[bytes, ...], ...] = (),
) -> LoadPlan:
    return LoadPlan(
        endpoint=endpoint,
        requests=requests,
        warmup_s=config.warmup_s,
        duration_s=config.duration_s,
        timeout_s=config.timeout_s,
        connect_timeout_s=config.connect_timeout_s,
        batch_size=config.batch_size,
        is_stream=config.is_stream,
        slot_requests=slot_requests,
    )


class _HttpRegistrar:
    """Triton's ``/v2/systemsharedmemory`` API: the HTTP
    :class:`~zeroserve.bench.shared_memory.Registrar`."""

    def __init__(self, config: BenchConfig, endpoint: Endpoint) -> None:
        self._config = config
        self._endpoint = endpoint

    def _post(self, name: str, action: str, document: dict[str, Any] | None) -> None:
        path = (
            f"{self._endpoint.base_path}/v2/systemsharedmemory/region/"
            f"{quote(name, safe='')}/{action}"
        )
        headers = {"Content-Type": "application/json"} | dict(self._config.headers)
        try:
            answer = fetch(
                self._endpoint,
                "POST",
                path,
                body=json.dumps(document).encode() if document is not None else b"",
                headers=headers,
                timeout_s=self._config.setup_timeout_s,
            )
        except OSError as exc:
            raise SharedMemoryError(f"cannot reach {self._config.url}: {exc}") from None
        if answer.status != 200:
            hint = " (the server must run on this machine and see its /dev/shm)"
            raise SharedMemoryError(
                f"{action} of region {name!r} answered {answer.status}: {_sample(answer.body)}"
                + (hint if action == "register" else "")
            )

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._post(name, "register", {"key": key, "offset": offset, "byte_size": byte_size})

    def unregister(self, name: str) -> None:
        self._post(name, "unregister", None)


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
        raise BenchError(
            f"{what} ({path}) answered {answer.status}: {_sample(answer.body)}"
            f"{_advice(answer.status)}"
        )
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
            f"{_advice(answer.status)}"
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


def _advice(status: int) -> str:
    """The option that fixes a refusal: a platform's model endpoints need an API key."""
    if status in (401, 403):
        return (
            "; pass the API key as --header 'Authorization: Bearer <key>' (`zeroserve keys "
            "create NAME --model MODEL` makes one)"
        )
    return ""


def _sample(body: bytes) -> str:
    return body[:300].decode("utf-8", errors="replace").strip() or "(empty body)"
