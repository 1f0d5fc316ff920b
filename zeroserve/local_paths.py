"""Where ``zeroserve up`` keeps its state by default, and local paths the CLI makes absolute.

The platform may run in another folder than the command that names a path (a registration
sent to a running platform), so the CLI turns relative local paths into absolute ones
against the caller's folder before they leave it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["absolute_local", "absolute_state_url", "default_state_path"]

_SQLITE = "sqlite:///"


def default_state_path(environ: Mapping[str, str], home: Path) -> Path:
    """``$XDG_DATA_HOME/zeroserve/state.db``, or ``~/.local/share/zeroserve/state.db`` when
    XDG_DATA_HOME is unset, empty or relative (the XDG base directory rules)."""
    data_home = environ.get("XDG_DATA_HOME", "")
    base = Path(data_home) if data_home and os.path.isabs(data_home) else home / ".local/share"
    return base / "zeroserve" / "state.db"


def absolute_state_url(url: str, cwd: Path) -> str:
    """A ``sqlite:///relative.db`` URL made absolute against ``cwd``
    (``sqlite:////abs/relative.db``); any other URL as it is."""
    if not url.startswith(_SQLITE):
        return url
    path = url[len(_SQLITE) :]
    if not path or os.path.isabs(path):
        return url
    return _SQLITE + absolute_local(path, cwd)


def absolute_local(location: str, cwd: Path) -> str:
    """A relative local path made absolute against ``cwd`` (normalised, symlinks kept: a
    link inside an allowed root stays inside it); URIs (``s3://``, ``file://``) and absolute
    paths as they are."""
    if "://" in location or os.path.isabs(location):
        return location
    return os.path.normpath(os.path.join(cwd, location))
