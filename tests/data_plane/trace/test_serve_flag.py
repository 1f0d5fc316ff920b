"""``zeroserve serve --trace-config ...``: Triton's flags reach the server's settings, and
the server they describe writes Triton's trace JSON to the flagged file.

``data_plane.server.run`` (which would block serving on real ports) is replaced by one
that keeps the settings the command built; the data plane those settings describe is then
served in process, through the same app and lifespan as ``run`` serves."""

from __future__ import annotations

from pathlib import Path

import pytest

import data_plane.server
from data_plane.settings import DataPlaneSettings
from tests.data_plane.trace.test_http import STAMPS, by_trace, infer
from tests.data_plane.trace.traced_app import data_plane_client
from tests.models import write_onnx_add_sub
from zeroserve.cli import main

pytestmark = pytest.mark.anyio


def settings_from(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> DataPlaneSettings:
    built: list[DataPlaneSettings] = []
    monkeypatch.setattr(data_plane.server, "run", built.append)
    assert main(argv) == 0
    assert len(built) == 1
    return built[0]


async def test_flagged_trace_file_gets_tritons_trace_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    repo = tmp_path / "repo"
    write_onnx_add_sub(repo, "simple", dims=(4,), max_batch_size=8)
    trace_file = tmp_path / "trace.json"
    settings = settings_from(
        [
            "serve",
            "--model-repository",
            str(repo),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--trace-config",
            f"triton,file={trace_file}",
            "--trace-config",
            "rate=2",
            "--trace-config",
            "level=TIMESTAMPS",
            "--trace-config",
            "count=2",
        ],
        monkeypatch,
    )
    settings = settings.model_copy(update={"gpu_count": 0, "exit_timeout_s": 5.0})
    async with data_plane_client(settings) as client:
        setting = (await client.get("/v2/trace/setting")).json()
        assert setting["trace_level"] == ["TIMESTAMPS"]
        assert (setting["trace_rate"], setting["trace_count"]) == ("2", "2")
        for n in range(6):
            await infer(client, request_id=f"r{n}")
    # Every second request, two of them: r1 and r3, written to the trace file when the
    # server stopped (Triton writes a numbered file early only when the traces taken equal
    # the requests seen, which at a rate above 1 they never do).
    traces = by_trace(trace_file)
    assert len(traces) == 2
    for entries in traces.values():
        assert entries[0]["model_name"] == "simple" and entries[0]["model_version"] == 1
        assert [e["timestamps"][0]["name"] for e in entries if "timestamps" in e] == STAMPS
    assert sorted(entries[0]["request_id"] for entries in traces.values()) == ["r1", "r3"]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("file=/tmp/t.json", "unknown --trace-config setting 'file=/tmp/t.json'"),
        ("mode=jaeger", "invalid value for trace mode option: jaeger"),
        ("rate=-5", "invalid settings"),
    ],
)
def test_bad_flags_end_the_command(
    option: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    code = main(["serve", "--model-repository", str(tmp_path), "--trace-config", option])
    assert code == 2
    assert message in capsys.readouterr().err
