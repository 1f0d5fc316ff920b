"""Request bytes: V2 JSON and binary bodies, OpenAI bodies, the HTTP/1.1 framing."""

from __future__ import annotations

import json
import struct

import httptools
import numpy as np
import pytest

from zeroserve.bench.inputs import InputError, Tensor
from zeroserve.bench.payload import (
    http_request,
    infer_path,
    openai_body,
    openai_path,
    v2_body,
)


def test_paths():
    assert infer_path("", "my model", None) == "/v2/models/my%20model/infer"
    assert infer_path("/prefix", "m", "2") == "/prefix/v2/models/m/versions/2/infer"
    assert openai_path("", "chat") == "/v1/chat/completions"
    assert openai_path("/x", "completions") == "/x/v1/completions"


def test_json_body():
    tensors = [
        Tensor("a", "FP32", np.array([[0.5, 1.25]], dtype="<f4")),
        Tensor("b", "BYTES", np.array([[b"hi"]], dtype=np.object_)),
        Tensor("c", "BOOL", np.array([True, False])),
    ]
    body = v2_body(tensors, is_binary=False)
    assert dict(body.headers)["Content-Type"] == "application/json"
    document = json.loads(body.content)
    assert document["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.25]},
        {"name": "b", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]},
        {"name": "c", "datatype": "BOOL", "shape": [2], "data": [True, False]},
    ]


def test_binary_body_is_header_then_raw_tensors_in_order():
    a = np.arange(3, dtype="<i4")
    tensors = [Tensor("a", "INT32", a), Tensor("s", "BYTES", np.array([b"xy", b""], np.object_))]
    body = v2_body(tensors, is_binary=True)
    headers = dict(body.headers)
    length = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body.content[:length])
    sizes = [i["parameters"]["binary_data_size"] for i in header["inputs"]]
    raw = body.content[length:]
    assert header["parameters"] == {"binary_data_output": True}
    assert raw[: sizes[0]] == a.tobytes()
    assert raw[sizes[0] :] == struct.pack("<I", 2) + b"xy" + struct.pack("<I", 0)
    assert sum(sizes) == len(raw)


def test_half_precision_needs_binary():
    tensor = Tensor("h", "FP16", np.zeros(2, dtype="<f2"))
    with pytest.raises(InputError, match="--binary"):
        v2_body([tensor], is_binary=False)
    assert len(v2_body([tensor], is_binary=True).content) > 4


def test_openai_bodies():
    completion = json.loads(
        openai_body("m", route="completions", prompt="hi", max_tokens=3).content
    )
    assert completion == {"model": "m", "max_tokens": 3, "stream": False, "prompt": "hi"}
    chat = json.loads(openai_body("m", route="chat", prompt="hi", max_tokens=3).content)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]


def test_request_bytes_parse_as_http():
    body = v2_body([Tensor("a", "FP32", np.zeros((1, 2), "<f4"))], is_binary=True)
    raw = http_request("127.0.0.1:8000", "POST", "/v2/models/m/infer", body, [("X-Key", "v")])
    headers: dict[str, str] = {}
    seen = {"url": b"", "body": b""}

    class Sink:
        def on_url(self, url):
            seen["url"] += url

        def on_header(self, name, value):
            headers[name.decode().lower()] = value.decode()

        def on_body(self, chunk):
            seen["body"] += chunk

    httptools.HttpRequestParser(Sink()).feed_data(raw)
    assert seen["url"] == b"/v2/models/m/infer"
    assert headers["host"] == "127.0.0.1:8000"
    assert headers["x-key"] == "v"
    assert headers["inference-header-content-length"]
    assert seen["body"] == body.content
