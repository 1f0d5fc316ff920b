"""Where the command line keeps the admin API's URL and token between runs.

One JSON file per user, ``$XDG_CONFIG_HOME/zeroserve/config.json`` (``~/.config/...`` when
the variable is unset), written by ``zeroserve login`` and by ``zeroserve up`` when it
starts::

    {"current": "http://127.0.0.1:8081",
     "admins": {"http://127.0.0.1:8081": {"token": "..."},
                "https://zeroserve.example.com": {"token": "..."}}}

Tokens are kept per URL, so a token is only ever sent to the admin API it was stored for;
``current`` is the URL commands use when neither ``--url`` nor ``ZEROSERVE_ADMIN_URL`` names
one. The file holds secrets: it is created with mode 0600 (its folder 0700) and replaced
atomically, so no reader ever sees it half written or readable by others, not even for the
moment between creating and chmod-ing it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundation.errors import ZeroserveError

__all__ = [
    "CredentialsError",
    "StoreOutcome",
    "StoredCredentials",
    "config_path",
    "normalise_url",
    "read_credentials",
    "store_credentials",
]

_FILE_MODE = 0o600
_DIR_MODE = 0o700


class CredentialsError(ZeroserveError):
    """The credentials file cannot be read or written."""

    def __init__(self, *, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class StoredCredentials:
    """What the credentials file holds (empty when there is none)."""

    current: str | None = None
    """The URL commands use by default."""
    tokens: Mapping[str, str] = field(default_factory=dict)
    """Admin token by (normalised) admin URL."""

    def token_for(self, url: str) -> str | None:
        """The token stored for ``url``, or None."""
        return self.tokens.get(normalise_url(url))


@dataclass(frozen=True)
class StoreOutcome:
    """What :func:`store_credentials` changed, for the command to say."""

    path: Path
    url: str
    replaced_token: bool
    """A different token was stored for ``url`` before."""
    previous_current: str | None
    """The default URL before, when it was another one (its token is kept)."""


def config_path(environ: Mapping[str, str]) -> Path:
    """The credentials file of the user whose environment is ``environ``.

    The XDG base-directory variables are the desktop standard every CLI honours, read here
    rather than through a settings object because they are not zeroserve's to prefix.
    """
    base = environ.get("XDG_CONFIG_HOME") or ""
    if not os.path.isabs(base):  # the spec: a relative value is invalid and ignored
        home = environ.get("HOME") or str(Path.home())
        base = os.path.join(home, ".config")
    return Path(base) / "zeroserve" / "config.json"


def normalise_url(url: str) -> str:
    """``url`` as the file keys it: without trailing slashes."""
    return url.strip().rstrip("/")


def read_credentials(path: Path) -> StoredCredentials:
    """The credentials in ``path``; empty when it does not exist.

    Raises CredentialsError when it exists but is not a credentials file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return StoredCredentials()
    except OSError as exc:
        raise CredentialsError(path=path, reason=exc.strerror or str(exc)) from None
    doc = _parse(path, text)
    tokens = {
        normalise_url(url): entry["token"]
        for url, entry in doc.get("admins", {}).items()
        if isinstance(entry, dict) and isinstance(entry.get("token"), str)
    }
    current = doc.get("current")
    return StoredCredentials(
        current=normalise_url(current) if isinstance(current, str) else None, tokens=tokens
    )


def store_credentials(path: Path, url: str, token: str) -> StoreOutcome:
    """Stores ``token`` for ``url`` in ``path`` and makes ``url`` the default.

    Tokens stored for other URLs stay. Raises CredentialsError when the file cannot be
    written (or holds something else than credentials, which is left as it is)."""
    url = normalise_url(url)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise CredentialsError(path=path, reason=exc.strerror or str(exc)) from None
    doc = _parse(path, text) if text else {}
    admins = doc.setdefault("admins", {})
    if not isinstance(admins, dict):
        raise CredentialsError(path=path, reason="'admins' is not an object")
    old = admins.get(url)
    replaced = isinstance(old, dict) and old.get("token") not in (None, token)
    previous = doc.get("current")
    admins[url] = {"token": token}
    doc["current"] = url
    _write_private(path, json.dumps(doc, indent=2) + "\n")
    return StoreOutcome(
        path=path,
        url=url,
        replaced_token=replaced,
        previous_current=previous if isinstance(previous, str) and previous != url else None,
    )


def _parse(path: Path, text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CredentialsError(path=path, reason=f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CredentialsError(path=path, reason="not a JSON object")
    return doc


def _write_private(path: Path, text: str) -> None:
    """Replaces ``path`` with ``text``, readable by its owner alone from the first byte."""
    try:
        path.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        # mkstemp: a fresh name opened with O_EXCL and mode 0600, so the secret is never in
        # a file others can read, nor written through a link someone left there.
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise CredentialsError(path=path, reason=exc.strerror or str(exc)) from None
    temporary = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        # A umask cannot widen 0600, but an odd filesystem may ignore the creation mode.
        os.chmod(temporary, _FILE_MODE)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise CredentialsError(path=path, reason=exc.strerror or str(exc)) from None
