"""A protobuf wire scanner for ONNX files: the graph's interface without its weights.

Auto-complete (:mod:`runtimes.onnx.complete`) reads the graph's inputs, outputs and
initializer names through :func:`read_graph_interface`; the control plane's registration
check reads a remote file's through :func:`scan_graph_interface` over ranged reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx

# Field numbers of onnx.proto (ModelProto.graph; GraphProto.initializer/input/output;
# TensorProto.name), and protobuf wire types.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT, _TENSOR_NAME = 7, 5, 11, 12, 8
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def read_graph_interface(
    path: Path,
) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto], set[str]]:
    """A model's graph inputs, outputs and initializer names, without reading its weights.

    ``onnx.load`` parses every initializer: about 1.5 s for a 1 GB model whose weights are
    inside the file, paid on every load. This walks the protobuf wire format instead and
    seeks past everything else (kilobytes read, whatever the model's size). Models whose
    file does not follow the layout onnx writes fall back to ``onnx.load``.
    """
    try:
        with path.open("rb") as file:
            return _scan_model(file, path.stat().st_size)
    except (ValueError, IndexError, EOFError):
        graph = onnx.load(str(path), load_external_data=False).graph
        return list(graph.input), list(graph.output), {i.name for i in graph.initializer}


def scan_graph_interface(
    file: BinaryIO, size: int
) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto], set[str]]:
    """:func:`read_graph_interface` over any seekable ``file`` of ``size`` bytes, without
    the fallback: raises ValueError, IndexError or EOFError for a file that does not
    follow the layout onnx writes (or is not ONNX)."""
    return _scan_model(file, size)


def _scan_model(
    file: BinaryIO, size: int
) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto], set[str]]:
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    initializers: set[str] = set()
    found_graph = False
    for field, length in _fields(file, size):
        if field != _MODEL_GRAPH or length is None:
            continue
        found_graph = True
        for sub, sub_length in _fields(file, file.tell() + length):
            if sub_length is None:
                continue
            if sub in (_GRAPH_INPUT, _GRAPH_OUTPUT):
                value = onnx.ValueInfoProto.FromString(_read_exactly(file, sub_length))
                (inputs if sub == _GRAPH_INPUT else outputs).append(value)
            elif sub == _GRAPH_INITIALIZER:
                end = file.tell() + sub_length
                for tensor_field, tensor_length in _fields(file, end):
                    if tensor_field == _TENSOR_NAME and tensor_length is not None:
                        initializers.add(_read_exactly(file, tensor_length).decode("utf-8"))
                    elif tensor_length is not None:
                        file.seek(tensor_length, os.SEEK_CUR)
            else:
                file.seek(sub_length, os.SEEK_CUR)
    if not found_graph:
        raise ValueError("no graph in the model file")
    return inputs, outputs, initializers


def _fields(file: BinaryIO, end: int) -> Iterator[tuple[int, int | None]]:
    """Walk the fields of a message ending at offset ``end``: ``(number, length)`` for
    length-delimited ones (the caller reads or seeks past the bytes), ``(number, None)``
    for scalars (already skipped)."""
    while file.tell() < end:
        key = _varint(file)
        field, wire = key >> 3, key & 7
        if wire == _LENGTH:
            length = _varint(file)
            if file.tell() + length > end:
                raise ValueError("field runs past its message")
            yield field, length
        elif wire == _VARINT:
            _varint(file)
            yield field, None
        elif wire in (_FIXED64, _FIXED32):
            file.seek(8 if wire == _FIXED64 else 4, os.SEEK_CUR)
            yield field, None
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if file.tell() != end:
        raise ValueError("message ends inside a field")


def _varint(file: BinaryIO) -> int:
    result = shift = 0
    while True:
        byte = file.read(1)
        if not byte:
            raise EOFError("truncated varint")
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return result
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _read_exactly(file: BinaryIO, length: int) -> bytes:
    data = file.read(length)
    if len(data) != length:
        raise EOFError("truncated field")
    return data
