"""``foundation.output``: one call prints a document as a table, json or yaml."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from foundation.output import Column, emit, human_age, human_bytes, human_duration

NOW = 1_800_000_000.0
DOC = {
    "models": [
        {
            "name": "resnet",
            "status": {"state": "ready", "replicas": [{"id": "w1"}, {"id": "w2"}]},
            "created_at": NOW - 180,
            "memory_bytes": 1_500_000_000,
            "took_s": 1.234,
            "tags": ["a", "b"],
        },
        {
            "name": "bert",
            "status": {"state": "scaled_to_zero", "replicas": []},
            "created_at": NOW - 7200,
            "memory_bytes": 512,
            "took_s": None,
            "tags": [],
        },
    ]
}
COLUMNS = (
    Column("NAME", "name"),
    Column("STATE", "status.state"),
    Column("REPLICAS", "status.replicas", "count"),
    Column("CREATED", "created_at", "age"),
    Column("MEMORY", "memory_bytes", "bytes"),
    Column("TOOK", "took_s", "duration"),
    Column("TAGS", "tags"),
    Column("UPPER", lambda item: item["name"].upper()),
    Column("ABSENT", "no.such.path"),
)


def printed(doc: object, fmt: str, **kwargs: object) -> str:
    out = io.StringIO()
    emit(doc, COLUMNS, fmt, out=out, now=NOW, **kwargs)  # type: ignore[arg-type]
    return out.getvalue()


def test_a_list_is_a_table_with_human_units():
    lines = printed(DOC, "table", items="models").splitlines()
    assert lines[0].split() == [c.header for c in COLUMNS]
    assert lines[1].split() == [
        "resnet", "ready", "2", "3m", "ago", "1.4", "GiB", "1.2", "s", "a,", "b", "RESNET", "-",
    ]  # fmt: skip
    assert lines[2].split() == [
        "bert", "scaled_to_zero", "0", "2h", "ago", "512", "B", "-", "-", "BERT", "-",
    ]  # fmt: skip
    # Columns line up: each header starts where its values start.
    start = lines[0].index("STATE")
    assert lines[1][start:].startswith("ready") and lines[2][start:].startswith("scaled")


def test_one_object_is_a_line_per_column():
    lines = printed(DOC["models"][0], "table").splitlines()
    assert len(lines) == len(COLUMNS)
    assert lines[0].split() == ["NAME", "resnet"]
    assert lines[3].split() == ["CREATED", "3m", "ago"]
    assert lines[4].split() == ["MEMORY", "1.4", "GiB"]


def test_an_empty_list_prints_the_header_alone():
    assert printed({"models": []}, "table", items="models").split() == [c.header for c in COLUMNS]


@pytest.mark.parametrize("fmt, parse", [("json", json.loads), ("yaml", yaml.safe_load)])
def test_json_and_yaml_print_the_whole_document(fmt: str, parse):
    assert parse(printed(DOC, fmt, items="models")) == DOC


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="table, json, yaml"):
        printed(DOC, "xml")


@pytest.mark.parametrize(
    "seconds, text",
    [
        pytest.param(0.0004, "0.4 ms", id="sub-ms"),
        pytest.param(0.25, "250 ms", id="ms"),
        pytest.param(1.23, "1.2 s", id="seconds"),
        pytest.param(42.4, "42 s", id="tens"),
        pytest.param(185, "3m 05s", id="minutes"),
        pytest.param(7500, "2h 05m", id="hours"),
        pytest.param(90000, "1d 01h", id="days"),
    ],
)
def test_durations(seconds: float, text: str):
    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    "size, text",
    [
        pytest.param(0, "0 B", id="zero"),
        pytest.param(1023, "1023 B", id="bytes"),
        pytest.param(1536, "1.5 KiB", id="kib"),
        pytest.param(300 * 2**20, "300 MiB", id="hundreds"),
        pytest.param(2**20 - 1, "1.0 MiB", id="rounds-up-a-unit"),
        pytest.param(int(1.4 * 2**30), "1.4 GiB", id="gib"),
    ],
)
def test_sizes(size: int, text: str):
    assert human_bytes(size) == text


@pytest.mark.parametrize(
    "delta, text",
    [
        pytest.param(0.2, "just now", id="now"),
        pytest.param(42, "42s ago", id="seconds"),
        pytest.param(185, "3m ago", id="minutes"),
        pytest.param(3 * 86400, "3d ago", id="days"),
        pytest.param(-120, "in 2m", id="future"),
    ],
)
def test_ages(delta: float, text: str):
    assert human_age(NOW - delta, NOW) == text
