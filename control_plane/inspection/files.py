"""What a registration check reads of a stored model: a listing and a few small files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["GraphInterface", "LocationError", "ModelFiles", "StoredListing"]


@dataclass(frozen=True)
class StoredListing:
    """A model's entries as a worker would lay them out.

    ``entries`` are ``/``-separated paths relative to the model folder: files, and folders
    ending in ``/`` (an empty version folder shows only that way). A single model file is
    listed as ``1/model.<ext>``, as the node cache lays it out. ``uri`` names the
    location as a worker's fetch names it; ``base`` is where the worker reads the folder
    from (a local folder's real path), for messages that name a file.
    """

    entries: tuple[str, ...]
    uri: str
    base: str
    is_single_file: bool = False

    def has(self, relative: str) -> bool:
        return relative in self.entries

    def files_under(self, folder: str) -> list[str]:
        """The files directly in ``folder`` (a relative folder path, no trailing ``/``)."""
        prefix = f"{folder}/"
        return [
            e[len(prefix) :]
            for e in self.entries
            if e.startswith(prefix) and "/" not in e[len(prefix) :] and not e.endswith("/")
        ]


@dataclass(frozen=True)
class GraphInterface:
    """An ONNX graph's request tensors: name -> ONNX Runtime type string
    (``tensor(float)``), initializers left out."""

    inputs: Mapping[str, str]
    outputs: Mapping[str, str]


class LocationError(Exception):
    """The stored model could not be read: ``message`` is the worker's words for it;
    ``is_transient`` when a retry later may succeed (the store unreachable or slow)."""

    def __init__(self, message: str, *, is_transient: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.is_transient = is_transient


class ModelFiles(Protocol):
    """A stored model, read without its weights. Every method may raise
    :class:`LocationError`."""

    def listing(self) -> StoredListing:
        """Every entry of the model (one listing call)."""
        ...

    def read(self, relative: str, *, max_bytes: int) -> bytes | None:
        """The file at ``relative``; None when it is larger than ``max_bytes``."""
        ...

    def graph_interface(self, relative: str) -> GraphInterface | None:
        """The ONNX file's inputs and outputs, read without its weights; None when that
        would cost more reads than a check may make (a remote graph far into its file).
        Raises ValueError when the file is not ONNX."""
        ...
