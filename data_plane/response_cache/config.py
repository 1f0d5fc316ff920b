"""Triton's ``--cache-config`` option, read into the data plane's settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LOCAL_CACHE = "local"
"""The one cache implementation offered: in the server's memory (Triton's ``local``)."""


def cache_config_overrides(options: Sequence[str]) -> dict[str, Any]:
    """The data plane's ``response_cache_bytes`` from Triton's ``--cache-config`` options,
    ``local,size=<bytes>``; empty when none is given. Raises ValueError for another cache
    (``redis`` is not offered), another setting, or a size that is not a positive whole
    number of bytes."""
    fields: dict[str, Any] = {}
    for option in options:
        cache, comma, setting = option.partition(",")
        name, equals, value = setting.partition("=")
        if not comma or not equals or not cache or not name:
            raise ValueError(
                f"--cache-config option format is '<cache name>,<setting>=<value>', got '{option}'"
            )
        if cache != LOCAL_CACHE:
            raise ValueError(
                f"cache '{cache}' is not supported by zeroserve; use --cache-config local,size=N"
            )
        if name != "size":
            raise ValueError(f"unknown setting '{name}' for the local cache; it takes size=<bytes>")
        if not value.isascii() or not value.isdigit() or int(value) == 0:
            raise ValueError(
                f"the local cache's size must be a positive number of bytes, got '{value}'"
            )
        fields["response_cache_bytes"] = int(value)
    return fields
