"""The admin API's key routes (``/admin/v1/keys``) and their bodies: parse and validate,
call ``KeyService``, encode the answer. The key itself appears in one answer only: the
creation's."""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from control_plane.api.bodies import read_json
from control_plane.api.schemas import schema_error
from control_plane.keys import KeyService
from foundation.keys import ApiKeyRecord, KeyLimits

__all__ = [
    "KeyCreate",
    "KeyCreated",
    "KeyLimitsSpec",
    "KeyList",
    "KeyView",
    "create",
    "key_view",
    "routes",
]

KeyState = Literal["active", "expired", "revoked"]
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@ -]{0,99}$"
_MODEL_PATTERN = r"^[A-Za-z0-9_.*?\[\]-][A-Za-z0-9_.*?\[\]/-]{0,199}$"


class KeyLimitsSpec(BaseModel):
    """A key's quotas; an absent field is no limit."""

    model_config = ConfigDict(extra="forbid")

    requests_per_s: float | None = Field(
        default=None, gt=0, le=1_000_000, description="Sustained requests per second"
    )
    burst: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Requests allowed at once after a quiet spell (default: the rate)",
    )
    max_in_flight: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Requests being served at once"
    )
    activations_per_hour: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Cold starts the key's requests may trigger in any hour (0: none)",
    )

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> Self:
        if self.burst is not None and self.requests_per_s is None:
            raise ValueError("burst needs requests_per_s")
        return self


class KeyCreate(BaseModel):
    """A new API key."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_NAME_PATTERN, description="A label for the key's owner")
    models: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        max_length=100,
        description="Model names or shell-style patterns it may call; '*' for all",
    )
    expires_at: float | None = Field(
        default=None, gt=0, description="Wall-clock seconds since the epoch; none: never"
    )
    expires_in_s: float | None = Field(
        default=None, gt=0, le=100 * 365 * 86400, description="Expires this long from now"
    )
    limits: KeyLimitsSpec = Field(default_factory=KeyLimitsSpec)

    @field_validator("models")
    @classmethod
    def _patterns(cls, models: list[str]) -> list[str]:
        for pattern in models:
            if not re.fullmatch(_MODEL_PATTERN, pattern):
                raise ValueError(f"{pattern!r} is not a model name or pattern")
        return models

    @model_validator(mode="after")
    def _checks(self) -> Self:
        if self.expires_at is not None and self.expires_in_s is not None:
            raise ValueError("give expires_at or expires_in_s, not both")
        return self


class KeyView(BaseModel):
    """An API key without its secret."""

    id: str = Field(description="Public id: the key's second part, zs_<id>_<secret>")
    name: str
    models: list[str]
    limits: KeyLimitsSpec
    created_at: float = Field(description="Wall-clock seconds since the epoch")
    expires_at: float | None
    revoked_at: float | None
    state: KeyState


class KeyCreated(KeyView):
    """A key just created, with the key itself: shown this once, never again."""

    key: str = Field(description="Send as 'Authorization: Bearer <key>'")


class KeyList(BaseModel):
    keys: list[KeyView]


def _keys(request: Request) -> KeyService:
    service: KeyService = request.state.keys
    return service


def key_view(service: KeyService, record: ApiKeyRecord) -> KeyView:
    """``record`` as the API shows it: without its secret."""
    limits = record.limits
    return KeyView(
        id=record.id,
        name=record.name,
        models=list(record.models),
        limits=KeyLimitsSpec(
            requests_per_s=limits.requests_per_s,
            burst=limits.burst,
            max_in_flight=limits.max_in_flight,
            activations_per_hour=limits.activations_per_hour,
        ),
        created_at=record.created_at,
        expires_at=record.expires_at,
        revoked_at=record.revoked_at,
        state=service.state(record),  # type: ignore[arg-type]
    )


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(
        model.model_dump_json().encode(), status_code=status, media_type="application/json"
    )


async def list_keys(request: Request) -> Response:
    service = _keys(request)
    return _json(KeyList(keys=[key_view(service, r) for r in await service.list()]))


async def create_key(request: Request) -> Response:
    try:
        body = KeyCreate.model_validate(await read_json(request))
    except ValidationError as exc:
        raise schema_error(exc) from None
    return _json(await create(_keys(request), body), 201)


async def create(service: KeyService, body: KeyCreate) -> KeyCreated:
    """Create the key ``body`` describes (the admin API's and the console's one way)."""
    expires_at = body.expires_at
    if body.expires_in_s is not None:
        expires_at = service.now() + body.expires_in_s
    token, record = await service.create(
        body.name,
        models=body.models,
        limits=KeyLimits(**body.limits.model_dump()),
        expires_at=expires_at,
    )
    view = key_view(service, record)
    return KeyCreated(**view.model_dump(), key=token)


async def get_key(request: Request) -> Response:
    service = _keys(request)
    return _json(key_view(service, await service.get(request.path_params["key_id"])))


async def revoke_key(request: Request) -> Response:
    service = _keys(request)
    return _json(key_view(service, await service.revoke(request.path_params["key_id"])))


routes = [
    Route("/admin/v1/keys", list_keys, methods=["GET"]),
    Route("/admin/v1/keys", create_key, methods=["POST"]),
    Route("/admin/v1/keys/{key_id}", get_key, methods=["GET"]),
    Route("/admin/v1/keys/{key_id}/revoke", revoke_key, methods=["POST"]),
]
