""":class:`ModelFiles` over the two stores a worker reads: a local path and ``s3://``.

Both go through the data plane's storage code where it has the step (the URI rules, the S3
listing and its error translation, the local walk), so that what a check sees, and the
words of what it cannot read, are what a worker's fetch would see and say. Everything here
blocks: :class:`~control_plane.inspection.inspector.RegistrationInspector` runs it in a
thread.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, BinaryIO, Final, cast

from control_plane.inspection.files import GraphInterface, LocationError, StoredListing
from data_plane.storage.errors import CacheFullError, StorageError, StorageNotFoundError
from data_plane.storage.s3 import Listing, RemoteObject, S3Store, translate_error
from data_plane.storage.uris import StorageUri
from runtimes.cache.layout import local_entries, local_files
from runtimes.errors import UnavailableError

__all__ = ["LocalFiles", "S3Files", "graph_interface_of"]

_BLOCK_BYTES: Final = 64 << 10
"""One ranged GET of an ONNX file's interface scan."""
_MAX_BLOCKS: Final = 32
"""Ranged GETs one interface scan may make (2 MiB); a graph whose interface lies further
into its file (weights stored inside it, ahead of the inputs) is left to the load."""


class LocalFiles:
    """A model at a local path (a folder, or a single model file), read in place."""

    def __init__(self, uri: StorageUri) -> None:
        self._uri = uri
        self._real: Path | None = None
        self._listing: StoredListing | None = None

    def listing(self) -> StoredListing:
        if self._listing is not None:
            return self._listing
        uri = self._uri
        allowed = uri.allowed_root_path.resolve()
        try:
            real = uri.local_path.resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError):
            raise LocationError(f"cannot fetch '{uri}': no such file or folder") from None
        except OSError as exc:
            raise LocationError(f"cannot fetch '{uri}': {exc}") from None
        self._check_inside(real, allowed)
        self._real = real
        if real.is_dir():
            entries = list(local_entries(real))
            for _relative, path in entries:
                self._check_inside(path.resolve(), allowed)
            files = [relative for relative, _ in local_files(real)]
            folders = [f"{relative}/" for relative, path in entries if path.is_dir()]
            self._listing = StoredListing(tuple(files + folders), uri=str(uri), base=str(real))
        else:
            self._listing = StoredListing(
                (f"1/model{real.suffix}",), uri=str(uri), base=str(uri), is_single_file=True
            )
        return self._listing

    def read(self, relative: str, *, max_bytes: int) -> bytes | None:
        path = self._path(relative)
        try:
            if path.stat().st_size > max_bytes:
                return None
            return path.read_bytes()
        except OSError as exc:
            raise LocationError(f"cannot fetch '{self._uri}': {exc}") from None

    def graph_interface(self, relative: str) -> GraphInterface | None:
        from runtimes.onnx.wire import read_graph_interface

        try:
            inputs, outputs, initializers = read_graph_interface(self._path(relative))
        except OSError as exc:
            raise LocationError(f"cannot fetch '{self._uri}': {exc}") from None
        except Exception as exc:
            raise ValueError(str(exc)) from exc
        return graph_interface_of(inputs, outputs, initializers)

    def _path(self, relative: str) -> Path:
        listing = self.listing()
        assert self._real is not None
        if listing.is_single_file:
            return self._real
        return self._real / relative

    def _check_inside(self, real: Path, allowed: Path) -> None:
        if not real.is_relative_to(allowed):
            raise LocationError(
                f"cannot fetch '{self._uri}': {real} (symlinks resolved) is outside the "
                f"allowed root {allowed}"
            )


class S3Files:
    """A model under an ``s3://`` URI, read by listing, small GETs and ranged GETs."""

    def __init__(self, uri: StorageUri, store: S3Store, client: Any) -> None:
        self._uri = uri
        self._store = store
        self._client = client
        self._objects: dict[str, RemoteObject] = {}
        self._listing: StoredListing | None = None

    def listing(self) -> StoredListing:
        if self._listing is not None:
            return self._listing
        try:
            listing: Listing = self._store.list_model(self._uri)
        except StorageError as exc:
            raise _location_error(exc) from None
        self._objects = {o.relative: o for o in listing.objects}
        self._listing = StoredListing(
            tuple(self._objects),
            uri=str(self._uri),
            base=str(self._uri),
            is_single_file=listing.is_single_file,
        )
        return self._listing

    def read(self, relative: str, *, max_bytes: int) -> bytes | None:
        obj = self._object(relative)
        if obj.size > max_bytes:
            return None
        try:
            response = self._client.get_object(Bucket=self._uri.bucket, Key=obj.key)
            return bytes(response["Body"].read())
        except Exception as exc:
            raise _location_error(translate_error(exc, uri=self._where(obj))) from None

    def graph_interface(self, relative: str) -> GraphInterface | None:
        from runtimes.onnx.wire import scan_graph_interface

        obj = self._object(relative)
        reader = _RangedReader(self._client, self._uri.bucket, obj)
        try:
            inputs, outputs, initializers = scan_graph_interface(cast(BinaryIO, reader), obj.size)
        except StorageError as exc:
            raise _location_error(exc) from None
        except (_TooManyReads, ValueError, IndexError, EOFError):
            # Too far into the file, or laid out in a way only onnx.load reads, which
            # needs the whole file: left to the load.
            return None
        return graph_interface_of(inputs, outputs, initializers)

    def _object(self, relative: str) -> RemoteObject:
        self.listing()
        obj = self._objects.get(relative)
        if obj is None:
            raise LocationError(
                StorageNotFoundError(uri=f"{self._uri}/{relative}", reason="no such object").message
            )
        return obj

    def _where(self, obj: RemoteObject) -> str:
        return f"s3://{self._uri.bucket}/{obj.key}"


class _TooManyReads(Exception):
    """The interface scan needed more ranged GETs than a check may make."""


class _RangedReader(io.RawIOBase):
    """A seekable read-only file over ranged GETs of one object, block by block, with at
    most :data:`_MAX_BLOCKS` GETs; each carries ``If-Match`` so every block comes from
    the same object version."""

    def __init__(self, client: Any, bucket: str, obj: RemoteObject) -> None:
        super().__init__()
        self._client = client
        self._bucket = bucket
        self._obj = obj
        self._pos = 0
        self._blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            self._pos = offset
        elif whence == os.SEEK_CUR:
            self._pos += offset
        else:
            self._pos = self._obj.size + offset
        return self._pos

    def read(self, size: int = -1) -> bytes:
        end = self._obj.size if size < 0 else min(self._pos + size, self._obj.size)
        out = bytearray()
        while self._pos < end:
            index = self._pos // _BLOCK_BYTES
            block = self._block(index)
            start = self._pos - index * _BLOCK_BYTES
            piece = block[start : start + (end - self._pos)]
            if not piece:
                break
            out += piece
            self._pos += len(piece)
        return bytes(out)

    def _block(self, index: int) -> bytes:
        block = self._blocks.get(index)
        if block is not None:
            return block
        if len(self._blocks) >= _MAX_BLOCKS:
            raise _TooManyReads()
        start = index * _BLOCK_BYTES
        last = min(start + _BLOCK_BYTES, self._obj.size) - 1
        try:
            response = self._client.get_object(
                Bucket=self._bucket,
                Key=self._obj.key,
                Range=f"bytes={start}-{last}",
                IfMatch=f'"{self._obj.etag}"',
            )
            block = bytes(response["Body"].read())
        except Exception as exc:
            raise translate_error(exc, uri=f"s3://{self._bucket}/{self._obj.key}") from exc
        self._blocks[index] = block
        return block


def graph_interface_of(inputs: Any, outputs: Any, initializers: set[str]) -> GraphInterface:
    """The request tensors of an ONNX graph (``onnx.ValueInfoProto`` lists), typed as ONNX
    Runtime names types (``tensor(float)``)."""
    import onnx

    def ort_type(value: Any) -> str:
        if value.type.WhichOneof("value") != "tensor_type":
            return "non-tensor"
        elem = onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type)
        return f"tensor({elem.lower()})"

    return GraphInterface(
        inputs={v.name: ort_type(v) for v in inputs if v.name not in initializers},
        outputs={v.name: ort_type(v) for v in outputs},
    )


def _location_error(exc: StorageError) -> LocationError:
    return LocationError(
        exc.message, is_transient=isinstance(exc, UnavailableError | CacheFullError)
    )
