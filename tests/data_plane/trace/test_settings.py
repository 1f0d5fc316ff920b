"""Start-up trace settings: Triton's ``--trace-config`` options and the environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from data_plane.settings import DataPlaneSettings
from data_plane.trace import TraceLevel
from data_plane.trace.settings import trace_config_overrides


def test_tritons_options_become_settings():
    overrides = trace_config_overrides(
        [
            "triton,file=/tmp/trace.json",
            "triton,log-frequency=50",
            "level=TIMESTAMPS",
            "level=TENSORS",
            "rate=1",
            "count=100",
            "mode=triton",
        ]
    )
    settings = DataPlaneSettings(model_repository="repo", **overrides)
    assert settings.trace_file == "/tmp/trace.json"
    assert settings.trace_log_frequency == 50
    assert settings.start_level == TraceLevel.TIMESTAMPS | TraceLevel.TENSORS
    assert (settings.trace_rate, settings.trace_count) == (1, 100)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("file=/tmp/x", "unknown --trace-config setting 'file=/tmp/x'"),
        ("triton,rate=5", "unknown --trace-config setting 'triton,rate=5'"),
        ("opentelemetry,url=localhost", "unknown --trace-config setting"),
        ("mode=opentelemetry", "trace mode 'opentelemetry' is not supported; use triton"),
        ("level", "--trace-config option format is"),
    ],
)
def test_other_options_are_refused(option: str, message: str):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        trace_config_overrides([option])


@pytest.mark.parametrize(
    "fields",
    [
        {"trace_level": "BOGUS"},
        {"trace_level": "OFF,TIMESTAMPS"},
        {"trace_rate": "-1"},
        {"trace_count": "-2"},
        {"trace_log_frequency": "x"},
    ],
)
def test_bad_values_are_refused_at_start(fields):
    with pytest.raises(ValidationError):
        DataPlaneSettings(model_repository="repo", **fields)


def test_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZEROSERVE_DATA_PLANE_TRACE_FILE", "/tmp/t.json")
    monkeypatch.setenv("ZEROSERVE_DATA_PLANE_TRACE_LEVEL", "TIMESTAMPS,TENSORS")
    monkeypatch.setenv("ZEROSERVE_DATA_PLANE_TRACE_RATE", "10")
    settings = DataPlaneSettings(model_repository="repo")
    assert settings.trace_level == ("TIMESTAMPS", "TENSORS")
    assert (settings.trace_file, settings.trace_rate) == ("/tmp/t.json", 10)
