"""The registration checks as pure functions, over an in-memory listing and small files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from control_plane.errors import InvalidRegistrationError, RegistrationCheckUnavailableError
from control_plane.inspection import (
    GraphInterface,
    LocationError,
    Registration,
    StoredListing,
    check_registration,
)
from foundation import model_config

ONNX_CONFIG = b'backend: "onnxruntime"\nmax_batch_size: 8\n'
GRAPH = GraphInterface(inputs={"x": "tensor(float)"}, outputs={"y": "tensor(float)"})


@dataclass
class MemoryFiles:
    """A stored model held in memory: its entries, small files and ONNX interfaces."""

    entries: tuple[str, ...]
    files: Mapping[str, bytes] = field(default_factory=dict)
    graphs: Mapping[str, GraphInterface | None] = field(default_factory=dict)
    error: LocationError | None = None
    single_file: bool = False
    reads: list[str] = field(default_factory=list)

    def listing(self) -> StoredListing:
        if self.error is not None:
            raise self.error
        return StoredListing(
            self.entries, uri="s3://b/m", base="s3://b/m", is_single_file=self.single_file
        )

    def read(self, relative: str, *, max_bytes: int) -> bytes | None:
        self.reads.append(relative)
        data = self.files[relative]
        return None if len(data) > max_bytes else data

    def graph_interface(self, relative: str) -> GraphInterface | None:
        self.reads.append(relative)
        return self.graphs[relative]


def _check(files: MemoryFiles, config: str | None = None, **fields: object) -> None:
    parsed = model_config.parse_json(config) if config is not None else None
    check_registration(Registration(name="m", config=parsed, **fields), files)  # type: ignore[arg-type]


def test_a_good_onnx_model_passes_reading_only_its_config_and_graph():
    files = MemoryFiles(
        ("config.pbtxt", "1/model.onnx", "2/model.onnx", "README.md"),
        files={"config.pbtxt": ONNX_CONFIG},
        graphs={"2/model.onnx": GRAPH},
    )
    _check(files)
    assert files.reads == ["config.pbtxt", "2/model.onnx"]  # the newest version's graph


def test_a_single_onnx_file_passes_as_version_1():
    files = MemoryFiles(("1/model.onnx",), graphs={"1/model.onnx": GRAPH}, single_file=True)
    _check(files)


def test_a_graph_too_far_into_its_file_is_left_to_the_load():
    files = MemoryFiles(
        ("1/model.onnx",),
        graphs={"1/model.onnx": None},
    )
    _check(files, '{"backend": "onnxruntime", "input": [{"name": "nope"}]}')


def test_a_config_larger_than_a_check_reads_is_left_to_the_load():
    files = MemoryFiles(
        ("config.pbtxt", "1/model.onnx"),
        files={"config.pbtxt": b"#" * (2 << 20)},
        graphs={"1/model.onnx": GRAPH},
    )
    _check(files)


def test_the_registration_config_replaces_the_stored_one():
    files = MemoryFiles(
        ("config.pbtxt", "1/model.onnx"),
        files={"config.pbtxt": b"this does not parse {"},
        graphs={"1/model.onnx": GRAPH},
    )
    _check(files, '{"backend": "onnxruntime", "input": [{"name": "x"}]}')
    assert "config.pbtxt" not in files.reads


def test_an_input_the_graph_lacks_names_the_graphs_inputs():
    files = MemoryFiles(("1/model.onnx",), graphs={"1/model.onnx": GRAPH})
    with pytest.raises(InvalidRegistrationError) as raised:
        _check(files, '{"backend": "onnxruntime", "input": [{"name": "nope"}]}')
    assert raised.value.message == (
        "load failed for model 'm': version 1 is at UNAVAILABLE state: configuration input "
        "'nope' is not a model input; model inputs: ['x'];\n"
    )


def test_model_code_is_refused_when_not_allowed():
    files = MemoryFiles(("1/model.py",))
    with pytest.raises(InvalidRegistrationError, match="is code \\(python backend\\)"):
        _check(files, allow_model_code=False)
    _check(files, allow_model_code=True)


def test_a_backend_outside_the_pool_is_refused_and_an_unknown_pool_is_not_judged():
    files = MemoryFiles(("1/model.pt",))
    with pytest.raises(InvalidRegistrationError, match="not available on the workers of pool"):
        _check(files, pool="gpu", pool_backends=("onnxruntime",))
    _check(files, pool="gpu", pool_backends=None)


def test_a_store_that_cannot_be_read_now_is_a_check_to_retry():
    files = MemoryFiles((), error=LocationError("cannot reach the store", is_transient=True))
    with pytest.raises(RegistrationCheckUnavailableError, match="cannot reach the store"):
        _check(files)


def test_a_location_that_cannot_be_read_is_refused_in_the_workers_words():
    files = MemoryFiles((), error=LocationError("cannot fetch 's3://b/m': access denied"))
    with pytest.raises(InvalidRegistrationError) as raised:
        _check(files)
    assert raised.value.message == (
        "failed to load 'm', failed to poll from model repository: "
        "cannot fetch 's3://b/m': access denied"
    )


def test_an_ensemble_is_not_judged_by_its_files():
    files = MemoryFiles(("1/",))
    _check(
        files,
        '{"platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "a", '
        '"model_version": -1, "input_map": {"x": "x"}, "output_map": {"y": "y"}}]}}',
    )
