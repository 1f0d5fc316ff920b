"""Sticky routing's pure parts: reading a request's sequence, the bindings table (END, idle,
bound in size) and the hash that sends one correlation ID to one replica."""

from __future__ import annotations

import json

import pytest

from activator.lb import Replica, choose_for_key
from activator.sequences import SequenceBindings, SequenceTag, sequence_tag
from tests.fakes import FakeClock


def infer_body(**parameters: object) -> bytes:
    inputs = [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}]
    # json, not orjson: a test body may hold an integer past 64 bits.
    return json.dumps({"inputs": inputs, "parameters": parameters}).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(infer_body(), None, id="no-parameters"),
        pytest.param(infer_body(sequence_id=0, sequence_start=True), None, id="id-0"),
        pytest.param(infer_body(sequence_id=""), None, id="id-empty"),
        pytest.param(infer_body(sequence_id=True), None, id="id-bool"),
        pytest.param(infer_body(sequence_id=-1), None, id="id-negative"),
        pytest.param(infer_body(sequence_id=2**64), None, id="id-too-big"),
        pytest.param(b'{"parameters": {"sequence_id": 5', None, id="not-json"),
        pytest.param(b'["sequence_id"]', None, id="not-an-object"),
        pytest.param(b'{"x": "sequence_id", "parameters": 3}', None, id="parameters-not-object"),
        pytest.param(infer_body(sequence_id=5), SequenceTag(5, False, False), id="step"),
        pytest.param(
            infer_body(sequence_id="s", sequence_start=True),
            SequenceTag("s", True, False),
            id="start",
        ),
        pytest.param(
            infer_body(sequence_id=2**64 - 1, sequence_end=True),
            SequenceTag(2**64 - 1, False, True),
            id="end",
        ),
        pytest.param(
            infer_body(sequence_id=5, sequence_start=1), SequenceTag(5, False, False), id="not-bool"
        ),
    ],
)
def test_sequence_tag(body: bytes, expected: SequenceTag | None) -> None:
    assert sequence_tag(body) == expected


def test_sequence_tag_reads_only_the_json_header_of_a_binary_body() -> None:
    header = infer_body(sequence_id=9, sequence_start=True)
    tensor = b'"sequence_id"\xff\x00'
    assert sequence_tag(header + tensor, len(header)) == SequenceTag(9, True, False)
    assert sequence_tag(infer_body() + tensor, len(infer_body())) is None


def test_bindings_bind_and_unbind_per_model() -> None:
    bindings = SequenceBindings(idle_s=10.0, max_entries=10, clock=FakeClock())
    bindings.bind("a", 1, "w1")
    bindings.bind("b", 1, "w2")
    bindings.bind("a", "x", "w2")
    assert (bindings.worker_of("a", 1), bindings.worker_of("b", 1)) == ("w1", "w2")
    assert (bindings.live("a"), bindings.live("b"), len(bindings)) == (2, 1, 3)
    bindings.unbind("a", 1)
    bindings.unbind("a", 1)  # twice is harmless
    assert bindings.worker_of("a", 1) is None
    assert (bindings.live("a"), len(bindings)) == (1, 2)


def test_bindings_age_out_after_idle_counted_from_last_use() -> None:
    clock = FakeClock()
    bindings = SequenceBindings(idle_s=10.0, max_entries=10, clock=clock)
    bindings.bind("a", 1, "w1")
    bindings.bind("a", 2, "w1")
    clock.advance(6)
    bindings.bind("a", 1, "w1")  # used again
    clock.advance(6)
    assert bindings.worker_of("a", 1) == "w1"
    assert bindings.worker_of("a", 2) is None
    clock.advance(10)
    assert bindings.live("a") == 0 and len(bindings) == 0


def test_bindings_are_bounded_least_recently_used_first() -> None:
    bindings = SequenceBindings(idle_s=10.0, max_entries=2, clock=FakeClock())
    bindings.bind("a", 1, "w1")
    bindings.bind("a", 2, "w1")
    bindings.bind("a", 1, "w1")
    bindings.bind("a", 3, "w2")
    assert [bindings.worker_of("a", i) for i in (1, 2, 3)] == ["w1", None, "w2"]
    assert bindings.live("a") == 2


@pytest.mark.parametrize(("idle_s", "entries"), [(0.0, 1), (1.0, 0)])
def test_bindings_need_a_positive_idle_and_room(idle_s: float, entries: int) -> None:
    with pytest.raises(ValueError):
        SequenceBindings(idle_s=idle_s, max_entries=entries)


def test_a_key_hashes_to_one_replica_and_moves_only_when_its_replica_goes() -> None:
    replicas = [Replica(f"w{i}", f"http://w{i}") for i in range(4)]
    keys: list[int | str] = [*range(1, 200), "a", "b"]
    chosen = {key: choose_for_key(replicas, key) for key in keys}
    assert {key: choose_for_key(list(reversed(replicas)), key) for key in keys} == chosen
    assert len({r.worker_id for r in chosen.values() if r}) == 4  # spread over all
    gone = replicas[2]
    rest = [r for r in replicas if r is not gone]
    for key, replica in chosen.items():
        if replica is not gone:
            assert choose_for_key(rest, key) is replica
    assert choose_for_key([], 1) is None
