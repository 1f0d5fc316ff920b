"""``zeroserve bench`` end to end against a real ``zeroserve serve`` on loopback.

One server (a tiny generated ONNX MLP) for the module; each test runs the command as a
subprocess for a fraction of a second per level and checks what it reports, never how fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.integration.conftest import free_port
from tests.llm_model import write_tiny_llm
from tests.models import write_onnx_add_sub, write_onnx_mlp
from tests.zeroserve.bench.serve import zeroserve_serve

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``zeroserve serve`` (the CLI, as a user starts it) on free loopback ports."""
    root = tmp_path_factory.mktemp("bench-serve")
    repo = root / "models"
    write_onnx_mlp(repo, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    write_onnx_add_sub(repo, "simple", dtype="INT32", dims=(4,), max_batch_size=8)
    write_tiny_llm(repo, "llm")
    with zeroserve_serve(repo, root) as served:
        yield served.url


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "zeroserve.cli", "bench", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def test_closed_loop_json_and_plot(server, tmp_path):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    done = _bench(
        server, "--model", "mlp", "--concurrency", "1,4", "--duration", "0.5s",
        "--warmup", "0.2s", "--json", str(out), "--plot", str(png),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "c=1" in done.stdout and "c=4" in done.stdout and "p99 ms" in done.stdout
    # Not a terminal: plain progress lines, no carriage returns.
    assert "[1/2] c=1" in done.stderr and "\r" not in done.stderr
    document = json.loads(out.read_text())
    assert document["target"]["protocol"] == "v2"
    assert document["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]
    levels = document["levels"]
    assert [level["level"] for level in levels] == [1.0, 4.0]
    for level in levels:
        assert level["ok"] > 0 and level["errors"] == {}
        assert level["latency"]["count"] == level["ok"]
        assert level["latency"]["p50_ms"] <= level["latency"]["p99_ms"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_results_on_stdout_as_json_or_yaml(server, tmp_path, fmt):
    out = tmp_path / "out.json"
    done = _bench(
        server, "--model", "mlp", "--concurrency", "1", "--duration", "0.3s",
        "--warmup", "0.1s", "--json", str(out), "-o", fmt,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # stdout is the document alone (what --json writes); the note about the file is on stderr.
    printed = json.loads(done.stdout) if fmt == "json" else yaml.safe_load(done.stdout)
    assert printed == json.loads(out.read_text())
    assert printed["levels"][0]["ok"] > 0
    assert f"results: {out}" in done.stderr


def test_open_loop_binary(server, tmp_path):
    out = tmp_path / "out.json"
    done = _bench(
        server, "--model", "mlp", "--request-rate", "50", "--duration", "0.5s",
        "--warmup", "0.1s", "--binary", "--batch-size", "2", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [level] = json.loads(out.read_text())["levels"]
    assert level["mode"] == "rate" and level["ok"] > 0 and level["errors"] == {}
    assert level["inferences_per_s"] == pytest.approx(2 * level["throughput"])
    assert "offered/s" in done.stdout


def test_input_data_file(server, tmp_path):
    data = tmp_path / "data.json"
    rows = [
        {"INPUT0": list(range(4)), "INPUT1": [1, 1, 1, 1]},
        {"INPUT0": [5] * 4, "INPUT1": [0] * 4},
    ]
    data.write_text(json.dumps({"data": rows}))
    out = tmp_path / "out.json"
    done = _bench(
        server, "--model", "simple", "--input-data", str(data), "--duration", "0.3s",
        "--warmup", "0s", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["target"]["distinct_requests"] == 2
    assert document["levels"][0]["ok"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(("--model", "nope"), "model metadata", id="unknown model"),
        pytest.param(("--model", "mlp", "--shape", "X:3"), "unknown inputs", id="bad shape"),
        pytest.param(
            ("--model", "mlp", "--openai"),
            "the check request to /v1/completions answered",
            id="not a language model",
        ),
    ],
)
def test_a_run_that_cannot_start_says_why(server, argv, message):
    done = _bench(server, *argv, "--duration", "0.2s", "--warmup", "0s")
    assert done.returncode == 2
    assert message in done.stderr


def test_unreachable_server():
    done = _bench(f"http://127.0.0.1:{free_port()}", "--model", "m", "--duration", "0.2s")
    assert done.returncode == 2 and "cannot reach" in done.stderr


class _KeyedPlatform(BaseHTTPRequestHandler):
    """A stand-in for a platform whose model endpoints need an API key (zeroserve up's
    default): every request without one is refused as the activator refuses it."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = json.dumps({"error": "missing API key: send 'Authorization: Bearer <key>'"})
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_refused_run_names_the_option_that_sends_a_key():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _KeyedPlatform)
    thread = threading.Thread(target=httpd.serve_forever, name="fake-keyed-platform")
    thread.start()
    try:
        done = _bench(
            f"http://127.0.0.1:{httpd.server_address[1]}", "--model", "m", "--duration", "0.2s"
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
    assert done.returncode == 2
    assert "answered 401" in done.stderr
    assert "--header 'Authorization: Bearer <key>'" in done.stderr
    assert "zeroserve keys create" in done.stderr


class _Completions(BaseHTTPRequestHandler):
    """A stand-in OpenAI server: every POST is a completion of the prompt it was sent."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, object]] = []

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if len(self.seen) < 5:
            self.seen.append({"path": self.path, "body": request})
        body = json.dumps({"id": "x", "choices": [{"index": 0, "text": " jumps"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_openai_completions(tmp_path):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    thread = threading.Thread(target=httpd.serve_forever, name="fake-openai")
    thread.start()
    try:
        out = tmp_path / "out.json"
        done = _bench(
            f"http://127.0.0.1:{httpd.server_address[1]}", "--model", "llm", "--openai",
            "--prompt", "The fox", "--max-tokens", "4", "--duration", "0.3s", "--warmup", "0s",
            "--json", str(out),
        )  # fmt: skip
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["levels"][0]["ok"] > 0
    assert _Completions.seen[0] == {
        "path": "/v1/completions",
        "body": {"model": "llm", "max_tokens": 4, "stream": False, "prompt": "The fox"},
    }


def test_openai_stream_against_a_real_llm(server, tmp_path):
    """``--stream`` on zeroserve's own OpenAI endpoint (the transformers engine, tiny Llama)."""
    out = tmp_path / "stream.json"
    done = _bench(
        server, "--model", "llm", "--openai", "--stream", "--max-tokens", "8",
        "--concurrency", "1,2", "--duration", "0.5s", "--warmup", "0s", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    levels = json.loads(out.read_text())["levels"]
    assert [level["ok"] > 0 for level in levels] == [True, True]
    assert all(not level["errors"] for level in levels), levels
    for level in levels:
        stream = level["stream"]
        assert stream["tokens"] > 0
        assert stream["tokens_from"] == "usage"
