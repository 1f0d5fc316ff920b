"""The run's shared-memory regions, in process with a recording registrar: what is written
where, one output window per slot, and that every region is unregistered and every object
removed however the run ends."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from zeroserve.bench.inputs import Tensor, TensorSpec
from zeroserve.bench.shared_memory import (
    ALIGN,
    SHM_ROOT,
    SharedMemoryError,
    SharedMemoryRun,
    output_sizes,
)


class _Registrar:
    """Records calls; refuses the ``fail_at``-th registration, or every unregistration."""

    def __init__(self, *, fail_at: int = 0, refuse_unregister: bool = False) -> None:
        self.registered: dict[str, tuple[str, int, int]] = {}
        self.calls = 0
        self._fail_at = fail_at
        self._refuse_unregister = refuse_unregister

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.calls += 1
        if self.calls == self._fail_at:
            raise SharedMemoryError("refused")
        # The key names the object the run made, whole.
        assert (SHM_ROOT / key.lstrip("/")).stat().st_size == byte_size
        self.registered[name] = (key, offset, byte_size)

    def unregister(self, name: str) -> None:
        if self._refuse_unregister:
            raise SharedMemoryError("server gone")
        del self.registered[name]


def _requests() -> list[list[Tensor]]:
    rng = np.random.default_rng(0)
    return [
        [
            Tensor("INPUT0", "FP32", rng.random((1, 5), dtype=np.float32)),
            Tensor("TEXT", "BYTES", np.array([[b"ab", b"cde"]], dtype=np.object_)),
        ]
        for _ in range(2)
    ]


OUTPUTS = [TensorSpec("OUTPUT0", "FP32", (-1, 3)), TensorSpec("OUTPUT1", "BYTES", (-1, 1))]


def _objects() -> set[str]:
    return {path.name for path in SHM_ROOT.glob("zsbench_*")}


def test_output_sizes():
    sizes = output_sizes(OUTPUTS, batch_size=4, is_batched=True, fallback=1000)
    assert sizes == [4 * 3 * 4, 1000]
    variable = [TensorSpec("O", "INT64", (2, -1))]
    assert output_sizes(variable, batch_size=1, is_batched=False, fallback=7) == [7]
    assert output_sizes([TensorSpec("O", "INT64", (2, 3))], batch_size=1, is_batched=False,
                        fallback=7) == [48]  # fmt: skip


def test_inputs_and_slot_windows():
    before = _objects()
    registrar = _Registrar()
    requests = _requests()
    sizes = output_sizes(OUTPUTS, batch_size=1, is_batched=True, fallback=100)
    with SharedMemoryRun(registrar, requests, OUTPUTS, sizes, slots=3) as run:
        assert set(registrar.registered) == {run.input_region, run.output_region}
        assert run.input_object is not None and run.output_object is not None
        for request, placed in zip(requests, run.layout.inputs, strict=True):
            for tensor, place in zip(request, placed, strict=True):
                assert (place.name, place.shape) == (tensor.name, tensor.shape)
                assert place.place.region == run.input_region
                assert place.place.offset % ALIGN == 0
                data = run.input_object.read(place.place.offset, place.place.byte_size)
                assert data == tensor.raw_bytes()
        windows = [
            (o.place.offset, o.place.offset + o.place.byte_size)
            for slot in run.layout.outputs
            for o in slot
        ]
        assert len(run.layout.outputs) == 3 and len(windows) == 6
        # No two outputs of any slots overlap, and all lie in the output object.
        ordered = sorted(windows)
        assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:], strict=False))
        assert ordered[-1][1] <= run.output_object.size
    assert registrar.registered == {}
    assert _objects() == before


def test_a_refused_registration_undoes_the_rest():
    before = _objects()
    registrar = _Registrar(fail_at=2)
    run = SharedMemoryRun(registrar, _requests(), OUTPUTS, [64, 64], slots=1)
    with pytest.raises(SharedMemoryError, match="refused"):
        run.__enter__()
    assert registrar.registered == {}
    assert _objects() == before


def test_objects_are_removed_even_when_the_server_cannot_be_told(caplog):
    before = _objects()
    registrar = _Registrar(refuse_unregister=True)
    with (
        caplog.at_level(logging.WARNING),
        SharedMemoryRun(registrar, _requests(), OUTPUTS, [64, 64], slots=2),
    ):
        pass
    assert _objects() == before
    assert "server gone" in caplog.text
