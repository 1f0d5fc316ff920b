"""``zeroserve models activations NAME --watch``: follow a model's activations live.

Reads the admin API's server-sent events (``GET /admin/v1/models/{name}/activations?
follow=true``) and prints one line per change of an activation: its phase, the worker it
loads on, the bytes its worker has downloaded so far, the time since it was queued, and,
once it has finished, its outcome, durations and the bytes fetched. With ``-o json`` each
change is one timeline document on a line of its own (JSON Lines), with ``-o yaml`` one YAML
document each (``---`` between them): every field, as the admin API sends it.
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


_WHERE = "zeroserve models activations"
_LOGIN_ADVICE = "run `zeroserve login` or pass --token (or set ZEROSERVE_ADMIN_TOKEN)"


def watch(
    settings: AdminClientSettings,
    name: str,
    *,
    wait_s: float,
    out: TextIO,
    err: TextIO,
    output: str = "table",
) -> int:
    """Print the activations of ``name`` as they change until they end, in ``output``
    (``table``: one line each; ``json``: one document a line; ``yaml``: one document each);
    the exit status (1 when the last activation seen failed, or the API refused or could not
    be reached; 2 without a token)."""
    if settings.token is None:
        print(f"{_WHERE}: no admin token for {settings.url}: {_LOGIN_ADVICE}", file=err)
        return 2
    headers = {
        "Accept": "text/event-stream",
        "Authorization": f"Bearer {settings.token.get_secret_value()}",
    }
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
                print(
                    f"{_WHERE}: {message} ({reply.status_code}){_advice(reply.status_code)}",
                    file=err,
                )
                return 1
            for event, data in server_sent_events(reply.iter_lines()):
                if event != "activation":
                    continue
                timeline = json.loads(data)
                seen += 1
                _print(timeline, output, out)
                status = 1 if timeline.get("outcome") == "failed" else 0
    except httpx.HTTPError as exc:
        print(
            f"{_WHERE}: cannot reach the admin API at {settings.url} ({exc}): is the platform "
            "running? Pass --url, or run `zeroserve login --url URL`",
            file=err,
        )
        return 1
    if not seen:
        # On stderr for json and yaml: their stdout holds documents only (here none).
        said = out if output == "table" else err
        print(f"no activation of {name} started within {wait_s:g} s", file=said)
    return status


def _print(timeline: dict[str, Any], output: str, out: TextIO) -> None:
    if output == "json":
        out.write(json.dumps(timeline, separators=(",", ":")) + "\n")
    elif output == "yaml":
        import yaml

        out.write("---\n" + yaml.safe_dump(timeline, sort_keys=False, allow_unicode=True))
    else:
        out.write(describe(timeline) + "\n")
    # Each change as it happens, also through a pipe.
    out.flush()


def _advice(status: int) -> str:
    if status == 401:
        return f": {_LOGIN_ADVICE}"
    if status == 404:
        return ": see `zeroserve models ls` for the registered models"
    return ""


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
