"""The ``zeroserve models`` client: admin API calls and what they print.

Results print through ``foundation.output.emit`` in the format ``-o`` asks for; the column
sets below are what the tables show (json and yaml print every field the API returns).
"""

from __future__ import annotations

import time
from typing import Any, TextIO
from urllib.parse import quote

import httpx

from control_plane.settings import AdminClientSettings
from foundation.output import Column, emit, human_duration

__all__ = ["AdminApiError", "AdminClient", "run", "run_keys"]


class AdminApiError(Exception):
    """The admin API answered with an error status."""

    def __init__(self, status: int, message: str, fields: list[str] | None = None) -> None:
        super().__init__(f"{message} ({status})")
        self.status = status
        self.message = message
        self.fields = fields or []
        """422 only: the dotted paths of the fields at fault."""


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
            fields = None
            try:
                doc = response.json()
                message = str(doc.get("error", response.text))
                fields = [str(f) for f in doc.get("fields") or ()]
            except (ValueError, AttributeError):
                message = response.text
            raise AdminApiError(response.status_code, message, fields)
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
    output: str = "table",
    dry_run: bool = False,
) -> int:
    """Run one ``zeroserve models`` command, printing its result as ``output`` (a format
    of ``foundation.output``) to ``out`` and errors to ``err``; the process exit status.
    ``dry_run`` (for ``register``) has the admin API check the registration without
    making it."""
    where = f"zeroserve models {command}"
    if settings.token is None:
        print(f"{where}: no admin token for {settings.url}: {_LOGIN_ADVICE}", file=err)
        return 2
    client = AdminClient(settings)
    # A name is one path segment, whatever it holds ('/', '?', '#' would change the URL).
    path = f"/models/{quote(name or '', safe='')}"
    try:
        if command == "ls":
            emit(client.call("GET", "/models"), _MODEL_COLUMNS, output, items="models", out=out)
        elif command == "register":
            query = "?dry_run=true" if dry_run else ""
            emit(client.call("POST", f"/models{query}", body), _MODEL_FIELDS, output, out=out)
        elif command == "update":
            emit(client.call("PATCH", path, body), _MODEL_FIELDS, output, out=out)
        elif command == "show":
            view = client.call("GET", path)
            if output == "table":
                # json and yaml print the API's document as it is; its usage is /usage's.
                view["usage_24h"] = client.call("GET", f"{path}/usage")
                emit(view, _SHOW_FIELDS, output, out=out)
            else:
                emit(view, _MODEL_FIELDS, output, out=out)
        elif command == "activations":
            doc = client.call("GET", f"{path}/activations")
            emit(doc, _ACTIVATION_COLUMNS, output, items="activations", out=out)
        elif command == "rm":
            client.call("DELETE", path)
            # The API answers 204: what is printed says what happened, in every format.
            emit({"name": name, "deleted": True}, _DELETED_FIELDS, output, out=out)
        elif command in ("load", "unload"):
            emit(client.call("POST", f"{path}/{command}"), _MODEL_FIELDS, output, out=out)
        elif command == "workers":
            doc = client.call("GET", "/workers")
            emit(doc, _WORKER_COLUMNS, output, items="workers", out=out)
        else:
            raise ValueError(f"unknown command {command!r}")
    except AdminApiError as exc:
        print(f"{where}: {exc}{_advice(exc, command, name)}", file=err)
        return 1
    except httpx.HTTPError as exc:
        print(
            f"{where}: cannot reach the admin API at {settings.url} ({exc}): is the platform "
            "running? Pass --url, or run `zeroserve login --url URL`",
            file=err,
        )
        return 1
    finally:
        client.close()
    return 0


_LOGIN_ADVICE = "run `zeroserve login` or pass --token (or set ZEROSERVE_ADMIN_TOKEN)"


def _advice(exc: AdminApiError, command: str, name: str | None) -> str:
    """What to do about ``exc``: the command or flag that fixes it, after a colon."""
    if exc.status == 401:
        return f": {_LOGIN_ADVICE}"
    if exc.status == 404 and name is not None:
        return ": see `zeroserve models ls` for the registered models"
    if exc.status == 409 and command == "register":
        return f": change it with `zeroserve models update {name}`, or `rm` it first"
    if exc.status == 422 and exc.fields:
        flags = ", ".join(_flag(field) for field in exc.fields)
        return f": check {flags}"
    return ""


def _flag(field: str) -> str:
    """The command-line option that sets the admin API field ``field`` (a dotted path)."""
    leaf = field.rsplit(".", 1)[-1]
    if field.startswith(("config.", "config")) and leaf != "config":
        return "--config"
    if leaf == "bls_models":
        return "--bls-model"
    if leaf == "name":
        return "NAME"
    return "--" + leaf.replace("_", "-")


def _replicas(view: dict[str, Any]) -> str:
    return ", ".join(r["worker_id"] for r in view["status"]["replicas"]) or "-"


def _last_activation(view: dict[str, Any]) -> str:
    last = view["status"].get("last_activation")
    if not last:
        return "-"
    total = last.get("durations_s", {}).get("total")
    took = f" in {human_duration(total)}" if isinstance(total, int | float) else ""
    return f"{last.get('outcome', '?')}{took}, cache {last.get('cache', '?')}"


def _phases(timeline: dict[str, Any]) -> str:
    # The timeline in one cell: each phase with the time it took since the one before.
    parts, before = [], 0.0
    for phase in timeline.get("phases", ()):
        at = float(phase.get("at_s", 0.0))
        parts.append(f"{phase.get('phase')} +{human_duration(max(at - before, 0.0))}")
        before = at
    return ", ".join(parts) or "-"


_MODEL_COLUMNS = (
    Column("NAME", "name"),
    Column("STATE", "status.state"),
    Column("REPLICAS", "status.replicas", "count"),
    Column("IN_FLIGHT", "status.in_flight"),
    Column("MIN", "scaling.min_replicas"),
    Column("MAX", "scaling.max_replicas"),
    Column("LAST_REQUEST", "status.last_request_at", "age"),
    Column("STORAGE", "storage_uri"),
    Column("FAILED", "status.failure.failed_at", "age"),
    Column("REASON", "status.failure.reason"),
)
"""``zeroserve models ls``: one row per model (a failed one with when and why)."""

_MODEL_FIELDS = (
    Column("NAME", "name"),
    Column("STATE", "status.state"),
    Column("REPLICAS", _replicas),
    Column("SLEEPING", lambda view: [r["worker_id"] for r in view["status"]["sleeping"]]),
    # Absent from an admin API older than the field: shown as missing, not an error.
    Column("VERSIONS", lambda view: view["status"].get("served_versions")),
    Column("IN_FLIGHT", "status.in_flight"),
    Column("LAST_REQUEST", "status.last_request_at", "age"),
    Column("LAST_ACTIVATION", _last_activation),
    Column("FAILED", "status.failure.failed_at", "age"),
    Column("REASON", "status.failure.reason"),
    Column("STORAGE", "storage_uri"),
    Column("BACKEND", "backend"),
    Column("PLATFORM", "platform"),
    Column("BLS_MODELS", "bls_models"),
    Column("MIN_REPLICAS", "scaling.min_replicas"),
    Column("MAX_REPLICAS", "scaling.max_replicas"),
    Column("TARGET_CONCURRENCY", "scaling.target_concurrency"),
    Column("IDLE_TIMEOUT", "scaling.idle_timeout_s", "duration"),
    Column("SLEEP_AFTER", lambda view: view["scaling"]["sleep_after_s"] or None, "duration"),
    Column("DEVICE", "resources.device"),
    Column("MEMORY", lambda view: view["resources"]["memory_bytes"] or None, "bytes"),
    Column("GENERATION", "generation"),
    Column("CREATED", "created_at", "age"),
)
"""One model (``show``, ``register``, ``update``, ``load``, ``unload``): a line per field."""

_SHOW_FIELDS = (
    *_MODEL_FIELDS,
    Column("SERVING_24H", "usage_24h.replica_seconds.serving", "duration"),
    Column("IDLE_24H", "usage_24h.replica_seconds.idle", "duration"),
    Column("LOADING_24H", "usage_24h.replica_seconds.loading", "duration"),
    Column("COLD_STARTS_24H", "usage_24h.cold_starts"),
    Column("COLD_START_WAIT_24H", "usage_24h.cold_start_wait_s", "duration"),
)
"""``zeroserve models show``: the model's fields, then its replica-seconds and cold starts over
the last 24 hours (``usage_24h``, the admin API's ``/usage``)."""

_ACTIVATION_COLUMNS = (
    Column("QUEUED", "queued_at", "age"),
    Column("TRIGGER", "trigger"),
    Column("OUTCOME", "outcome"),
    Column("WORKER", "worker.id"),
    Column("CACHE", "cache"),
    Column("FETCHED", lambda t: t.get("bytes_fetched") or None, "bytes"),
    Column("FETCH", "durations_s.fetch", "duration"),
    Column("LOAD", "durations_s.load", "duration"),
    Column("TOTAL", "durations_s.total", "duration"),
    Column("PHASES", _phases),
    Column("ERROR", "error"),
)
"""``zeroserve models activations``: one row per activation, newest first."""

_WORKER_COLUMNS = (
    Column("ID", "id"),
    Column("POOL", "pool"),
    Column("DEVICE", "device"),
    Column("STATE", "state"),
    Column("MEMORY", lambda worker: worker["memory_bytes"] or None, "bytes"),
    Column("STARTED", "started_at", "age"),
    Column("MODELS", "models"),
    Column("URL", "url"),
)
"""``zeroserve models workers``: one row per worker."""

_DELETED_FIELDS = (Column("NAME", "name"), Column("DELETED", "deleted"))


def _limits(key: dict[str, Any]) -> str:
    limits = ", ".join(f"{k}={v:g}" for k, v in key["limits"].items() if v is not None)
    return limits or "-"


def _expires(key: dict[str, Any]) -> str:
    expires = key.get("expires_at")
    if not expires:
        return "never"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))


_KEY_COLUMNS = (
    Column("ID", "id"),
    Column("NAME", "name"),
    Column("STATE", "state"),
    Column("MODELS", lambda key: ",".join(key["models"])),
    Column("LIMITS", _limits),
    Column("EXPIRES", _expires),
)
"""``zeroserve keys``: one row per key (never the key itself, which only ``create`` shows)."""


def run_keys(
    command: str,
    settings: AdminClientSettings,
    *,
    key_id: str | None = None,
    body: dict[str, Any] | None = None,
    output: str = "table",
    out: TextIO,
    err: TextIO,
) -> int:
    """Run one ``zeroserve keys`` command; the process exit status. ``create`` prints the
    new key once (it is never shown again); nothing else ever prints a key."""
    where = f"zeroserve keys {command}"
    if settings.token is None:
        print(f"{where}: no admin token for {settings.url}: {_LOGIN_ADVICE}", file=err)
        return 2
    client = AdminClient(settings)
    path = f"/keys/{quote(key_id or '', safe='')}"
    try:
        if command == "create":
            created = client.call("POST", "/keys", body)
            if output == "table":
                print(
                    f"created key {created['id']} ({created['name']}); it is shown this once:\n"
                    f"{created['key']}",
                    file=out,
                )
            else:
                emit(created, _KEY_COLUMNS, output, out=out)
        elif command == "ls":
            emit(client.call("GET", "/keys"), _KEY_COLUMNS, output, items="keys", out=out)
        elif command == "show":
            emit(client.call("GET", path), _KEY_COLUMNS, output, out=out)
        elif command == "revoke":
            revoked = client.call("POST", f"{path}/revoke")
            if output == "table":
                print(f"revoked key {revoked['id']} ({revoked['name']})", file=out)
            else:
                emit(revoked, _KEY_COLUMNS, output, out=out)
        else:
            raise ValueError(f"unknown command {command!r}")
    except AdminApiError as exc:
        advice = f": {_LOGIN_ADVICE}" if exc.status == 401 else ""
        if exc.status == 404:
            advice = ": see `zeroserve keys ls` for the keys"
        print(f"{where}: {exc}{advice}", file=err)
        return 1
    except httpx.HTTPError as exc:
        print(
            f"{where}: cannot reach {settings.url}: {exc}. Pass --url, or run "
            "`zeroserve login --url URL`",
            file=err,
        )
        return 1
    finally:
        client.close()
    return 0
