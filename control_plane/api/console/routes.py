"""The console's pages and forms: parse the form, call ``AdminService``, render or redirect.

Every change is a POST of a form that carries the session's CSRF token, answered with a
redirect (303) to the page that shows its result, with a one-line message for it. The
session itself is checked before any of this by ``guard.ConsoleGuard``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from control_plane.api import keys as api_keys, schemas
from control_plane.api.bodies import validate
from control_plane.api.console import timeline
from control_plane.api.console.guard import COOKIE, LOGIN_CHECK
from control_plane.api.console.session import SessionKeys
from control_plane.api.console.stats import RequestHistory, Window
from control_plane.api.routes import follow_response
from control_plane.api.service import AdminService
from control_plane.errors import SchemaValidationError
from control_plane.keys import KeyService
from foundation.errors import ZeroserveError

__all__ = ["ConsoleState", "console_routes"]

_HERE = Path(__file__).parent
_MAX_FORM_BYTES = 256 * 2**10
_T = TypeVar("_T", bound=BaseModel)
_WINDOWS = (("hour", 3600.0), ("day", 86400.0))


@dataclass(frozen=True, slots=True)
class ConsoleState:
    """What the console's handlers need besides the admin service (``request.state.console``)."""

    keys: SessionKeys
    history: RequestHistory | None
    """Request counters over time; None without an activator in the process."""
    templates: Jinja2Templates


class _CsrfError(Exception):
    """A change without the session's CSRF token."""


def create_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=_HERE / "templates")
    env = templates.env
    env.filters["seconds"] = _seconds
    env.filters["bytes"] = _bytes
    env.filters["when"] = _when
    env.filters["json"] = lambda doc: orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()
    env.globals["bars"] = timeline.bars
    return templates


def _state(request: Request) -> ConsoleState:
    state: ConsoleState = request.state.console
    return state


def _service(request: Request) -> AdminService:
    service: AdminService = request.state.service
    return service


def _page(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    console = _state(request)
    cookie = request.cookies.get(COOKIE, "")
    context.update(
        csrf=console.keys.csrf_token(cookie) if cookie else "",
        msg=request.query_params.get("msg", ""),
        error=request.query_params.get("error", ""),
        section=template.removesuffix(".html"),
    )
    return console.templates.TemplateResponse(request, template, context, status_code=status)


def _back(path: str, *, msg: str = "", error: str = "") -> RedirectResponse:
    query = urlencode({k: v for k, v in (("msg", msg), ("error", error)) if v})
    return RedirectResponse(f"{path}?{query}" if query else path, status_code=303)


async def _form(request: Request, *, check_csrf: bool = True) -> dict[str, str]:
    """The urlencoded form of ``request``; raises ``_CsrfError`` without the right token."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > _MAX_FORM_BYTES:
            raise _CsrfError("the form is too large")
    fields = {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
    if check_csrf:
        keys = _state(request).keys
        if not keys.is_csrf_valid(request.cookies.get(COOKIE), fields.get("csrf")):
            raise _CsrfError("the form's CSRF token is missing or wrong: reload the page")
    return fields


def _refused(exc: _CsrfError) -> Response:
    return Response(str(exc), status_code=403, media_type="text/plain")


# ---- login ----


async def index(request: Request) -> Response:
    return RedirectResponse("/console/models", status_code=303)


async def login_form(request: Request) -> Response:
    return _page(request, "login.html")


async def login(request: Request) -> Response:
    fields = await _form(request, check_csrf=False)
    keys = _state(request).keys
    if not keys.is_admin_token(fields.get("token", "")):
        return _page(request, "login.html", status=401, login_error="wrong admin token")
    # Through the check: a browser that drops the cookie is told why, not sent back to an
    # empty login form.
    response = RedirectResponse(LOGIN_CHECK, status_code=303)
    # Secure even on plain http: browsers keep Secure cookies of http://localhost and
    # 127.0.0.1 (zeroserve up), and elsewhere the console belongs behind TLS.
    response.set_cookie(
        COOKIE,
        keys.issue(time.time()),
        max_age=int(keys.lifetime_s),
        path="/console",
        secure=True,
        httponly=True,
        samesite="strict",
    )
    return response


async def login_check(request: Request) -> Response:
    """Where a login lands: on to the models with the session cookie, else why it is missing."""
    if _state(request).keys.is_valid(request.cookies.get(COOKIE), time.time()):
        return RedirectResponse("/console/models", status_code=303)
    return _page(request, "login.html", status=400, login_error=_COOKIE_DROPPED)


_COOKIE_DROPPED = (
    "the browser did not keep the session cookie: it is Secure, so a browser keeps it over "
    "https, or over plain http to 127.0.0.1 or localhost only. Reach the admin port through "
    "TLS (a load balancer or ingress in front of it) or a tunnel to loopback "
    "(ssh -L 8081:127.0.0.1:8081 HOST)."
)


async def logout(request: Request) -> Response:
    try:
        await _form(request)
    except _CsrfError as exc:
        return _refused(exc)
    response = RedirectResponse("/console/login", status_code=303)
    response.delete_cookie(COOKIE, path="/console", secure=True, httponly=True, samesite="strict")
    return response


# ---- models ----


async def models_page(request: Request) -> Response:
    service = _service(request)
    models = (await service.list_models()).models
    history = _state(request).history
    windows: dict[str, dict[str, Window]] = {}
    if history is not None:
        windows = {label: history.windows(span) for label, span in _WINDOWS}
    now = time.time()
    cold_starts: dict[str, dict[str, int]] = {}
    for model in models:
        records = (await service.activations(model.name)).activations
        cold_starts[model.name] = {
            label: sum(
                1
                for t in records
                if t.get("trigger") == "request" and float(t.get("queued_at", 0)) > now - span
            )
            for label, span in _WINDOWS
        }
    usage = {
        model.name: {
            label: (await service.usage(model.name, start=now - span, end=now)).replica_seconds
            for label, span in _WINDOWS
        }
        for model in models
    }
    return _page(
        request,
        "models.html",
        usage=usage,
        models=models,
        windows=windows,
        has_metrics=history is not None,
        cold_starts=cold_starts,
        window_labels=[label for label, _ in _WINDOWS],
    )


async def register(request: Request) -> Response:
    try:
        fields = await _form(request)
    except _CsrfError as exc:
        return _refused(exc)
    try:
        body = _registration(fields, request)
        view = await _service(request).register(body)
    except ZeroserveError as exc:
        return _back("/console/models", error=exc.message)
    return _back(f"/console/models/{view.name}", msg=f"registered {view.name}")


def _registration(fields: dict[str, str], request: Request) -> schemas.ModelCreate:
    doc: dict[str, Any] = {
        "name": fields.get("name", "").strip(),
        "storage_uri": fields.get("storage_uri", "").strip(),
    }
    for key in ("backend", "platform"):
        if fields.get(key, "").strip():
            doc[key] = fields[key].strip()
    if fields.get("config", "").strip():
        try:
            doc["config"] = orjson.loads(fields["config"])
        except orjson.JSONDecodeError as exc:
            raise SchemaValidationError(errors=[("config", f"not JSON: {exc}")]) from None
    scaling = _scaling_fields(fields)
    if scaling:
        doc["scaling"] = scaling
    return validate(schemas.ModelCreate, doc, request)


def _scaling_fields(fields: dict[str, str]) -> dict[str, str]:
    names = ("min_replicas", "max_replicas", "target_concurrency", "idle_timeout_s")
    return {name: fields[name].strip() for name in names if fields.get(name, "").strip()}


async def model_page(request: Request) -> Response:
    name = request.path_params["name"]
    service = _service(request)
    try:
        view = await service.get(name)
        records = (await service.activations(name)).activations
    except ZeroserveError as exc:
        return _back("/console/models", error=exc.message)
    return _page(
        request,
        "model.html",
        model=view,
        activations=records,
        now=time.time(),
        is_running=any(t.get("outcome") == "running" for t in records),
    )


async def model_action(request: Request) -> Response:
    name = request.path_params["name"]
    action = request.path_params["action"]
    service = _service(request)
    page = f"/console/models/{name}"
    try:
        fields = await _form(request)
    except _CsrfError as exc:
        return _refused(exc)
    try:
        if action == "load":
            await service.get(name)
            service.start_load(name)
            return _back(page, msg=f"loading {name}")
        if action == "unload":
            await service.unload(name)
            return _back(page, msg=f"unloaded {name}")
        if action == "scaling":
            patch = validate(schemas.ModelPatch, {"scaling": _scaling_fields(fields)}, request)
            await service.update(name, patch)
            return _back(page, msg="scaling changed")
        if action == "delete":
            await service.delete(name)
            return _back("/console/models", msg=f"deleted {name}")
    except ZeroserveError as exc:
        return _back(page, error=exc.message)
    return Response("no such action", status_code=404, media_type="text/plain")


async def follow(request: Request) -> Response:
    """The model's activations as server-sent events, for the page's script."""
    return await follow_response(
        _service(request), request.path_params["name"], request.query_params.get("wait_s")
    )


# ---- workers and keys ----


async def workers_page(request: Request) -> Response:
    service = _service(request)
    workers = (await service.workers()).workers
    memory = {m.name: m.resources.memory_bytes for m in (await service.list_models()).models}
    used = {w.id: sum(memory.get(name, 0) for name in w.models) for w in workers}
    return _page(request, "workers.html", workers=workers, used=used)


def _key_service(request: Request) -> KeyService:
    service: KeyService = request.state.keys
    return service


async def keys_page(request: Request, created: api_keys.KeyCreated | None = None) -> Response:
    service = _key_service(request)
    listed = [api_keys.key_view(service, record) for record in await service.list()]
    listed.sort(key=lambda view: view.created_at, reverse=True)
    return _page(request, "keys.html", keys=listed, created=created)


async def create_key(request: Request) -> Response:
    """The new key is in this one answer's page, never in a URL: it is not redirected."""
    try:
        fields = await _form(request)
    except _CsrfError as exc:
        return _refused(exc)
    try:
        body = validate(api_keys.KeyCreate, _key_fields(fields), request)
        created = await api_keys.create(_key_service(request), body)
    except ZeroserveError as exc:
        return _back("/console/keys", error=exc.message)
    return await keys_page(request, created)


def _key_fields(fields: dict[str, str]) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": fields.get("name", "").strip()}
    models = [m.strip() for m in fields.get("models", "").split(",") if m.strip()]
    if models:
        doc["models"] = models
    days = fields.get("expires_in_days", "").strip()
    if days:
        try:
            doc["expires_in_s"] = float(days) * 86400.0
        except ValueError:
            raise SchemaValidationError(errors=[("expires_in_days", "not a number")]) from None
    limits = {
        name: fields[name].strip()
        for name in ("requests_per_s", "max_in_flight", "activations_per_hour")
        if fields.get(name, "").strip()
    }
    if limits:
        doc["limits"] = limits
    return doc


async def revoke_key(request: Request) -> Response:
    key_id = request.path_params["key_id"]
    try:
        await _form(request)
    except _CsrfError as exc:
        return _refused(exc)
    try:
        await _key_service(request).revoke(key_id)
    except ZeroserveError as exc:
        return _back("/console/keys", error=exc.message)
    return _back("/console/keys", msg=f"revoked key {key_id}")


def console_routes() -> list[BaseRoute]:
    return [
        Route("/console", index, methods=["GET"]),
        Route("/console/login", login_form, methods=["GET"]),
        Route("/console/login", login, methods=["POST"]),
        Route(LOGIN_CHECK, login_check, methods=["GET"]),
        Route("/console/logout", logout, methods=["POST"]),
        Route("/console/models", models_page, methods=["GET"]),
        Route("/console/models", register, methods=["POST"]),
        Route("/console/models/{name}", model_page, methods=["GET"]),
        Route("/console/models/{name}/follow", follow, methods=["GET"]),
        Route("/console/models/{name}/{action}", model_action, methods=["POST"]),
        Route("/console/workers", workers_page, methods=["GET"]),
        Route("/console/keys", keys_page, methods=["GET"]),
        Route("/console/keys", create_key, methods=["POST"]),
        Route("/console/keys/{key_id}/revoke", revoke_key, methods=["POST"]),
        Mount("/console/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]


# ---- formatting ----


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
