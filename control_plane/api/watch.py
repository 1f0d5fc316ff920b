"""``zeroserve models activations NAME --watch``: follow a model's activations live.

Reads the admin API's server-sent events (``GET /admin/v1/models/{name}/activations?
follow=true``) and prints one line per change of an activation: its phase, the worker it
loads on, the bytes its worker has downloaded so far, the time since it was queued, and,
once it has finished, its outcome, durations and the bytes fetched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TextIO
from urllib.parse import quote

import httpx

from control_plane.settings import AdminClientSettings

__all__ = ["describe", "server_sent_events", "watch"]

_READ_TIMEOUT_S = 60.0
"""Longest silence accepted from the stream; the server sends a comment every 15 s."""


def watch(
    settings: AdminClientSettings, name: str, *, wait_s: float, out: TextIO, err: TextIO
) -> int:
    """Print the activations of ``name`` as they change until they end; the exit status
    (1 when the last activation seen failed, or the API refused or could not be reached)."""
    headers = {"Accept": "text/event-stream"}
    if settings.token is not None:
        headers["Authorization"] = f"Bearer {settings.token.get_secret_value()}"
    url = f"{settings.url.rstrip('/')}/admin/v1/models/{quote(name, safe='')}/activations"
    timeout = httpx.Timeout(10.0, read=_READ_TIMEOUT_S)
    status = 0
    seen = 0
    try:
        with (
            httpx.Client(headers=headers, timeout=timeout) as http,
            http.stream("GET", url, params={"follow": "true", "wait_s": str(wait_s)}) as reply,
        ):
            if reply.status_code >= 400:
                reply.read()
                try:
                    message = str(reply.json().get("error", reply.text))
                except ValueError:
                    message = reply.text
                print(f"zeroserve models activations: {reply.status_code}: {message}", file=err)
                return 1
            for event, data in server_sent_events(reply.iter_lines()):
                if event != "activation":
                    continue
                timeline = json.loads(data)
                seen += 1
                print(describe(timeline), file=out, flush=True)
                status = 1 if timeline.get("outcome") == "failed" else 0
    except httpx.HTTPError as exc:
        print(f"zeroserve models activations: cannot reach {settings.url}: {exc}", file=err)
        return 1
    if not seen:
        print(f"no activation of {name} started within {wait_s:g} s", file=out)
    return status


def server_sent_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) for each event in an SSE stream's lines; comments are skipped."""
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield event, "\n".join(data)


def describe(timeline: dict[str, Any]) -> str:
    """One line for an activation as it stands."""
    phases = timeline.get("phases") or [{"phase": "queued", "at_s": 0.0}]
    last = phases[-1]
    worker = (timeline.get("worker") or {}).get("id")
    where = f" on {worker}" if worker else ""
    head = f"{timeline.get('id', '?')} {timeline.get('trigger', '?')}:"
    outcome = timeline.get("outcome")
    if outcome == "running":
        current = timeline.get("current", last["phase"])
        fetched, total = timeline.get("bytes_fetched"), timeline.get("bytes_total")
        moved = ""
        if isinstance(fetched, int) and isinstance(total, int):
            moved = f", {_size(fetched)} of {_size(total)} fetched"
        return f"{head} {current}{where}{moved} (began {last['at_s']:.1f} s after queued)"
    durations = timeline.get("durations_s") or {}
    total = durations.get("total")
    took = f" in {total:.2f} s" if isinstance(total, int | float) else ""
    if outcome == "failed":
        return f"{head} failed{where}{took} after {last['phase']}: {timeline.get('error')}"
    parts = [f"{k} {v:.2f} s" for k, v in durations.items() if k != "total" and v is not None]
    fetched = timeline.get("bytes_fetched")
    extra = f", cache {timeline.get('cache', 'unknown')}"
    if isinstance(fetched, int):
        extra += f", {_size(fetched)} fetched"
    detail = f" ({', '.join(parts)}{extra})" if parts else f" ({extra.lstrip(', ')})"
    return f"{head} {outcome}{where}{took}{detail}"


def _size(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
