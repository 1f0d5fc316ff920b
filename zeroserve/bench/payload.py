"""Request bytes, built once before the clock starts: V2 infer bodies (JSON, Triton's binary
tensor extension, or naming shared-memory regions), OpenAI completion bodies, and the whole
HTTP/1.1 request around them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from zeroserve.bench.inputs import InputError, Tensor
from zeroserve.bench.shared_memory import PlacedInput, PlacedOutput, Placement


@dataclass(frozen=True)
class Body:
    """A request body and the headers that describe it."""

    content: bytes
    headers: tuple[tuple[str, str], ...]


def infer_path(base_path: str, model: str, version: str | None) -> str:
    """``{base}/v2/models/{model}[/versions/{version}]/infer``."""
    path = f"{base_path}/v2/models/{quote(model, safe='')}"
    if version is not None:
        path += f"/versions/{quote(version, safe='')}"
    return path + "/infer"


def openai_path(base_path: str, route: str) -> str:
    """``{base}/v1/completions`` or ``{base}/v1/chat/completions``."""
    return f"{base_path}/v1/chat/completions" if route == "chat" else f"{base_path}/v1/completions"


def v2_body(tensors: Sequence[Tensor], *, is_binary: bool) -> Body:
    """An infer request for ``tensors``: JSON ``data``, or the binary tensor extension (JSON
    header, then each input's raw bytes in order, binary outputs asked for)."""
    if not is_binary:
        inputs = [_json_input(t) for t in tensors]
        content = orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY)
        return Body(content, (("Content-Type", "application/json"),))
    raws = [t.raw_bytes() for t in tensors]
    header: dict[str, Any] = {
        "inputs": [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": list(t.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
            for t, raw in zip(tensors, raws, strict=True)
        ],
        "parameters": {"binary_data_output": True},
    }
    head = orjson.dumps(header)
    return Body(
        head + b"".join(raws),
        (
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", str(len(head))),
        ),
    )


def v2_shared_memory_body(inputs: Sequence[PlacedInput], outputs: Sequence[PlacedOutput]) -> Body:
    """An infer request whose inputs are read from, and outputs written to, registered
    shared-memory regions: no tensor data in the body."""
    document = {
        "inputs": [
            {
                "name": i.name,
                "datatype": i.datatype,
                "shape": list(i.shape),
                "parameters": shared_memory_parameters(i.place),
            }
            for i in inputs
        ],
        "outputs": [
            {"name": o.name, "parameters": shared_memory_parameters(o.place)} for o in outputs
        ],
    }
    return Body(orjson.dumps(document), (("Content-Type", "application/json"),))


def shared_memory_parameters(place: Placement) -> dict[str, str | int]:
    """Triton's parameters placing a tensor in a region."""
    return {
        "shared_memory_region": place.region,
        "shared_memory_offset": place.offset,
        "shared_memory_byte_size": place.byte_size,
    }


def openai_body(
    model: str, *, route: str, prompt: str, max_tokens: int, is_stream: bool = False
) -> Body:
    """A completion (or chat completion) request for ``prompt``; streamed (SSE, with the
    final usage asked for) when ``is_stream``."""
    document: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": is_stream}
    if is_stream:
        document["stream_options"] = {"include_usage": True}
    if route == "chat":
        document["messages"] = [{"role": "user", "content": prompt}]
    else:
        document["prompt"] = prompt
    return Body(orjson.dumps(document), (("Content-Type", "application/json"),))


def http_request(
    host_header: str,
    method: str,
    path: str,
    body: Body | None,
    extra_headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """The request's bytes for a keep-alive HTTP/1.1 connection."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host_header}"]
    headers: Mapping[str, str] = dict(body.headers) if body is not None else {}
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"{name}: {value}" for name, value in extra_headers]
    lines.append(f"Content-Length: {len(body.content) if body is not None else 0}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (body.content if body is not None else b"")


def _json_input(tensor: Tensor) -> dict[str, Any]:
    if tensor.datatype in ("FP16", "BF16"):
        # Triton refuses FP16/BF16 in JSON ("Please use the binary data format").
        raise InputError(f"{tensor.datatype} input {tensor.name!r} needs --binary")
    data: Any
    if tensor.datatype == "BYTES":
        data = [_text(v) for v in tensor.array.ravel().tolist()]
    else:
        data = np.ascontiguousarray(tensor.array).ravel()
    return {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
        "data": data,
    }


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
