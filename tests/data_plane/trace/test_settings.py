"""Start-up trace settings: Triton's ``--trace-config`` options and the environment."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pydantic import ValidationError

from data_plane.settings import DataPlaneSettings
from data_plane.trace import TraceLevel
from data_plane.trace.options import trace_config_overrides

OTEL_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")


@pytest.mark.parametrize(
    ("options", "fields"),
    [
        (["rate=100"], {"trace_rate": "100"}),
        (["count=-1"], {"trace_count": "-1"}),
        (["level=TIMESTAMPS"], {"trace_level": ("TIMESTAMPS",)}),
        (["level=timestamps", "level=Tensors"], {"trace_level": ("TIMESTAMPS", "TENSORS")}),
        (["level=max", "level=on", "level=true"], {"trace_level": ("TIMESTAMPS",)}),
        # OFF anywhere turns tracing off, as in Triton.
        (["level=TIMESTAMPS", "level=off"], {"trace_level": ("OFF",)}),
        (["mode=triton"], {"trace_mode": "triton"}),
        (["mode=OpenTelemetry"], {"trace_mode": "opentelemetry"}),
        (["triton,file=/tmp/t.json"], {"trace_file": "/tmp/t.json"}),
        (["Triton,log-frequency=50"], {"trace_log_frequency": "50"}),
        (["rate=1", "rate=7"], {"trace_rate": "7"}),
        (
            ["opentelemetry,url=localhost:4318/v1/traces"],
            {"trace_otel_url": "localhost:4318/v1/traces"},
        ),
        (
            ["opentelemetry,resource=service.name=zs", "opentelemetry,resource=a=b,c"],
            {"trace_otel_resource": ("service.name=zs", "a=b,c")},
        ),
        (["opentelemetry,bsp_max_queue_size=10"], {"trace_otel_bsp_max_queue_size": "10"}),
        (["opentelemetry,bsp_schedule_delay=0"], {"trace_otel_bsp_schedule_delay_ms": "0"}),
        (
            ["opentelemetry,bsp_max_export_batch_size=5"],
            {"trace_otel_bsp_max_export_batch_size": "5"},
        ),
        ([], {}),
    ],
)
def test_tritons_options_become_fields(options: list[str], fields: dict[str, Any]):
    assert trace_config_overrides(options) == fields


def test_tritons_example_becomes_settings():
    overrides = trace_config_overrides(
        [
            "triton,file=/tmp/trace.json",
            "triton,log-frequency=50",
            "rate=100",
            "level=TIMESTAMPS",
            "count=100",
        ]
    )
    settings = DataPlaneSettings(model_repository="repo", **overrides)
    assert settings.trace_file == "/tmp/trace.json"
    assert settings.trace_log_frequency == 50
    assert settings.start_level == TraceLevel.TIMESTAMPS
    assert (settings.trace_rate, settings.trace_count) == (100, 100)
    assert settings.trace_mode == "triton"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("file=/tmp/x", "unknown --trace-config setting 'file=/tmp/x' (the trace file is triton"),
        ("log_frequency=5", "unknown --trace-config setting 'log_frequency=5' (triton mode's"),
        ("triton,rate=5", "unknown --trace-config setting 'triton,rate=5'"),
        ("opentelemetry,file=/x", "unknown --trace-config setting 'opentelemetry,file=/x'"),
        (
            "mode=jaeger",
            'invalid value for trace mode option: jaeger. Available options are "triton"',
        ),
        ("jaeger,url=x", "invalid value for trace mode option: jaeger"),
        ("level=verbose", "invalid value for trace level option: verbose"),
        (",rate=1", "No trace mode specified"),
        ("level", "--trace-config option format is '<trace mode>,<setting>=<value>'. Got level"),
        ("rate=", "--trace-config option format is"),
        ("triton,=x", "--trace-config option format is"),
    ],
)
def test_other_options_are_refused(option: str, message: str):
    with pytest.raises(ValueError) as caught:
        trace_config_overrides([option])
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    "fields",
    [
        {"trace_level": "BOGUS"},
        {"trace_level": "OFF,TIMESTAMPS"},
        {"trace_rate": "-1"},
        {"trace_count": "-2"},
        {"trace_log_frequency": "x"},
        {"trace_mode": "jaeger"},
        {"trace_otel_resource": "novalue"},
        {"trace_otel_bsp_max_queue_size": "0"},
        {"trace_otel_bsp_max_queue_size": "10", "trace_otel_bsp_max_export_batch_size": "11"},
    ],
)
def test_bad_values_are_refused_at_start(fields):
    with pytest.raises(ValidationError):
        DataPlaneSettings(model_repository="repo", **fields)


def test_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZEROSERVE_DATA_PLANE_TRACE_FILE", "/tmp/t.json")
    monkeypatch.setenv("ZEROSERVE_DATA_PLANE_TRACE_LEVEL", "TIMESTAMPS,TENSORS")
    monkeypatch.setenv("ZEROSERVE_DATA_PLANE_TRACE_RATE", "10")
    monkeypatch.setenv("ZEROSERVE_DATA_PLANE_TRACE_OTEL_RESOURCE", "a=1,b=2")
    settings = DataPlaneSettings(model_repository="repo")
    assert settings.trace_level == ("TIMESTAMPS", "TENSORS")
    assert (settings.trace_file, settings.trace_rate) == ("/tmp/t.json", 10)
    assert settings.trace_otel_resource == ("a=1", "b=2")


def test_opentelemetry_mode_without_the_packages_is_refused(monkeypatch: pytest.MonkeyPatch):
    """The packages are hidden from import (a None entry in sys.modules makes ``import``
    fail), which is what a machine without the otel extra sees."""
    for module in OTEL_MODULES:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ValidationError) as caught:
        DataPlaneSettings(model_repository="repo", trace_mode="opentelemetry")
    assert (
        "trace mode 'opentelemetry' needs the OpenTelemetry SDK and its OTLP/HTTP exporter "
        "(pip install 'zeroserve[otel]')" in str(caught.value)
    )
    # The file mode does not need them.
    assert DataPlaneSettings(model_repository="repo").trace_mode == "triton"
