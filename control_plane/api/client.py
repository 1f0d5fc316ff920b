"""The ``zeroserve models`` client: admin API calls and what they print."""

from __future__ import annotations

import json
from typing import Any, TextIO
from urllib.parse import quote

import httpx

from control_plane.settings import AdminClientSettings

__all__ = ["AdminApiError", "AdminClient", "run"]


class AdminApiError(Exception):
    """The admin API answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class AdminClient:
    """Blocking calls to the admin API (the CLI makes one call per run)."""

    def __init__(self, settings: AdminClientSettings) -> None:
        headers = {}
        if settings.token is not None:
            headers["Authorization"] = f"Bearer {settings.token.get_secret_value()}"
        self._http = httpx.Client(
            base_url=settings.url.rstrip("/"), headers=headers, timeout=settings.timeout_s
        )

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._http.request(method, f"/admin/v1{path}", json=body)
        if response.status_code >= 400:
            try:
                message = str(response.json().get("error", response.text))
            except ValueError:
                message = response.text
            raise AdminApiError(response.status_code, message)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def close(self) -> None:
        self._http.close()


def run(
    command: str,
    settings: AdminClientSettings,
    *,
    name: str | None = None,
    body: dict[str, Any] | None = None,
    out: TextIO,
    err: TextIO,
) -> int:
    """Run one ``zeroserve models`` command; the process exit status."""
    client = AdminClient(settings)
    # A name is one path segment, whatever it holds ('/', '?', '#' would change the URL).
    path = f"/models/{quote(name or '', safe='')}"
    try:
        if command == "ls":
            _print_table(client.call("GET", "/models")["models"], out)
        elif command == "register":
            _print_json(client.call("POST", "/models", body), out)
        elif command == "show":
            view = client.call("GET", path)
            view["usage_24h"] = client.call("GET", f"{path}/usage")
            _print_json(view, out)
        elif command == "activations":
            _print_json(client.call("GET", f"{path}/activations"), out)
        elif command == "rm":
            client.call("DELETE", path)
            print(f"deleted {name}", file=out)
        elif command in ("load", "unload"):
            view = client.call("POST", f"{path}/{command}")
            _print_status(view, out)
        elif command == "workers":
            _print_json(client.call("GET", "/workers"), out)
        else:
            raise ValueError(f"unknown command {command!r}")
    except AdminApiError as exc:
        print(f"zeroserve models {command}: {exc}", file=err)
        return 1
    except httpx.HTTPError as exc:
        print(f"zeroserve models {command}: cannot reach {settings.url}: {exc}", file=err)
        return 1
    finally:
        client.close()
    return 0


def _print_json(doc: Any, out: TextIO) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False), file=out)


def _print_status(view: dict[str, Any], out: TextIO) -> None:
    status = view["status"]
    replicas = ", ".join(r["worker_id"] for r in status["replicas"]) or "-"
    print(f"{view['name']}: {status['state']} (replicas: {replicas})", file=out)
    last = status.get("last_activation")
    if last:
        durations = ", ".join(f"{k} {v:.3f}s" for k, v in last["durations_s"].items() if v)
        print(f"last activation: {last['outcome']}, cache {last['cache']}: {durations}", file=out)


def _print_table(models: list[dict[str, Any]], out: TextIO) -> None:
    rows = [("NAME", "STATE", "REPLICAS", "IN_FLIGHT", "MIN", "MAX", "STORAGE")]
    for m in models:
        status = m["status"]
        rows.append(
            (
                m["name"],
                status["state"],
                str(len(status["replicas"])),
                str(status["in_flight"]),
                str(m["scaling"]["min_replicas"]),
                str(m["scaling"]["max_replicas"]),
                m["storage_uri"],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out
        )
