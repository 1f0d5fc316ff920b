"""The admin API's request and response bodies, as pydantic models.

Requests are validated against these (unknown fields are errors, so a typo is reported, not
ignored); ``storage_uri`` is checked against the allowed storage roots passed in the
validation context (``{"allowed_storage": [...]}``), and a ``backend``, ``platform`` or
``config`` that makes the model code (``data_plane.model_code``) is refused when the context
says ``{"allow_model_code": False}``. The OpenAPI document is generated from the same models
(``openapi.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from control_plane.errors import SchemaValidationError
from data_plane import model_code
from data_plane.storage.errors import StorageNotAllowedError
from data_plane.storage.uris import parse_storage_uri
from foundation import ensemble_config, model_config, names

__all__ = [
    "Activations",
    "KeepAlivePolicyName",
    "ReplicaSeconds",
    "UsageView",
    "Device",
    "ErrorBody",
    "Failure",
    "ModelCreate",
    "ModelList",
    "ModelPatch",
    "ModelState",
    "ModelStatus",
    "ModelView",
    "Replica",
    "ResourceSpec",
    "ResourcesPatch",
    "ScalingPatch",
    "ScalingSpec",
    "WorkerList",
    "WorkerView",
    "check_config",
    "bls_self_call_problem",
    "check_bls_models",
    "check_config_code",
    "check_model_code",
    "check_storage_uri",
    "merge_scaling",
    "schema_error",
]

Device = Literal["cpu", "cuda"]
MAX_BLS_MODELS = 64
"""The most models one registration may name in ``bls_models``."""
KeepAlivePolicyName = Literal["fixed", "adaptive"]
ModelState = Literal["ready", "loading", "unloading", "sleeping", "scaled_to_zero", "failed"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScalingSpec(_Strict):
    """How many replicas a model may have and when it goes idle."""

    min_replicas: int = Field(default=0, ge=0, le=1000, description="0 = scale to zero")
    max_replicas: int = Field(default=1, ge=1, le=1000)
    target_concurrency: float = Field(
        default=8.0, gt=0, le=1_000_000, description="In-flight requests per replica to aim for"
    )
    idle_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=30 * 86400,
        description="No request in flight for this long: the model unloads (min_replicas 0)",
    )
    sleep_after_s: float = Field(
        default=0.0,
        ge=0,
        le=30 * 86400,
        description="No request in flight for this long: the replicas sleep (LLM engines: "
        "KV cache freed, weights in host memory) until a request wakes them or "
        "idle_timeout_s unloads them (min_replicas 0); 0 = never sleep",
    )
    policy: KeepAlivePolicyName = Field(
        default="fixed",
        description="Keep-alive policy: fixed (unload after idle_timeout_s) or adaptive "
        "(learned from the model's idle times: unload sooner, pre-warm before the predicted "
        "next request; idle_timeout_s is the longest it keeps a replica idle)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be at least min_replicas")
        if self.sleep_after_s and self.sleep_after_s >= self.idle_timeout_s:
            raise ValueError("sleep_after_s must be less than idle_timeout_s (or 0: never)")
        return self


class ResourceSpec(_Strict):
    """What one replica needs from a worker."""

    device: Device = "cpu"
    memory_bytes: int = Field(
        default=0, ge=0, description="Memory one loaded replica takes; 0 = unknown"
    )


class ScalingPatch(_Strict):
    """Fields of ``scaling`` to change; absent ones stay."""

    min_replicas: int | None = Field(default=None, ge=0, le=1000)
    max_replicas: int | None = Field(default=None, ge=1, le=1000)
    target_concurrency: float | None = Field(default=None, gt=0, le=1_000_000)
    idle_timeout_s: float | None = Field(default=None, gt=0, le=30 * 86400)
    sleep_after_s: float | None = Field(default=None, ge=0, le=30 * 86400)
    policy: KeepAlivePolicyName | None = None


class ResourcesPatch(_Strict):
    """Fields of ``resources`` to change; absent ones stay."""

    device: Device | None = None
    memory_bytes: int | None = Field(default=None, ge=0)


def check_storage_uri(value: str | None, info: ValidationInfo) -> str | None:
    """Refuse URIs outside the allowed roots given in the validation context."""
    context = info.context
    if value is not None and isinstance(context, dict) and "allowed_storage" in context:
        try:
            parse_storage_uri(value, allowed=list(context["allowed_storage"]))
        except StorageNotAllowedError as exc:
            raise ValueError(str(exc)) from None
    return value


def check_config(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """Refuse configs that are not Triton ModelConfig JSON."""
    if value is None:
        return None
    try:
        model_config.parse_json(json.dumps(value))
    except model_config.ConfigError as exc:
        raise ValueError(f"not a Triton ModelConfig: {exc}") from None
    return value


def _refuse_model_code(info: ValidationInfo, *, backend: str = "", platform: str = "") -> None:
    context = info.context
    if not isinstance(context, dict) or context.get("allow_model_code", True):
        return
    kind = model_code.named_code_backend(backend=backend, platform=platform)
    if kind is not None:
        raise ValueError(
            f"'{kind}' models are code that the workers run, and this control plane does not "
            "register model code; its operator can allow it with "
            "ZEROSERVE_CONTROL_PLANE_ALLOW_MODEL_CODE=true"
        )


def check_model_code(value: str | None, info: ValidationInfo) -> str | None:
    """Refuse a ``backend`` or ``platform`` naming a runtime whose models are code, when
    the validation context does not allow model code."""
    if value:
        if info.field_name == "platform":
            _refuse_model_code(info, platform=value)
        else:
            _refuse_model_code(info, backend=value)
    return value


def check_config_code(value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
    """As :func:`check_model_code`, for the ``backend`` and ``platform`` of a ``config``."""
    if value is not None:
        backend, platform = value.get("backend"), value.get("platform")
        _refuse_model_code(
            info,
            backend=backend if isinstance(backend, str) else "",
            platform=platform if isinstance(platform, str) else "",
        )
    return value


def check_bls_models(value: list[str] | None) -> list[str] | None:
    """Refuse names no worker could load, and a name given twice."""
    if value is None:
        return None
    for name in value:
        problem = names.model_name_problem(name)
        if problem is not None:
            raise ValueError(f"bls_models: {problem}")
    if len(set(value)) != len(value):
        raise ValueError("bls_models names a model more than once")
    return value


def bls_self_call_problem(name: str, bls_models: Iterable[str]) -> str | None:
    """Why ``bls_models`` cannot be model ``name``'s (it names the model itself), or None.
    A registration knows its name; a patch learns it from the record, hence a function."""
    if name in bls_models:
        return f"names the model itself ('{name}')"
    return None


class ModelCreate(_Strict):
    """``POST /admin/v1/models``: register a model."""

    name: str = Field(
        min_length=1,
        max_length=names.MODEL_NAME_MAX_LENGTH,
        description=f"The model's name in URLs and on workers: {names.MODEL_NAME_RULE}",
    )
    storage_uri: str = Field(
        min_length=1, description="s3://bucket/prefix, file:///abs/path or /abs/path"
    )
    platform: str = Field(default="", description="Triton platform, e.g. onnxruntime_onnx")
    backend: str = Field(default="", description="Triton backend, e.g. onnxruntime, python")
    config: dict[str, Any] | None = Field(
        default=None,
        description="Triton ModelConfig fields as JSON; optional when the stored model has "
        "config.pbtxt",
    )
    bls_models: list[str] = Field(
        default_factory=list,
        max_length=MAX_BLS_MODELS,
        description="Models this model's code calls through BLS (pb_utils.InferenceRequest"
        "(...).exec()): placed and loaded on its worker before it, unloaded after it",
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    resources: ResourceSpec = Field(default_factory=ResourceSpec)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # The rule every worker applies when it fetches the model: a name it would refuse
        # is refused here, before anything is registered under it.
        problem = names.model_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    _storage_uri = field_validator("storage_uri")(check_storage_uri)
    _config = field_validator("config")(check_config)
    _code = field_validator("backend", "platform")(check_model_code)
    _config_code = field_validator("config")(check_config_code)
    _bls_models = field_validator("bls_models")(check_bls_models)

    @model_validator(mode="after")
    def _not_its_own_bls_model(self) -> Self:
        problem = bls_self_call_problem(self.name, self.bls_models)
        if problem is not None:
            raise ValueError(f"bls_models {problem}")
        return self

    @model_validator(mode="after")
    def _config_name(self) -> Self:
        named = (self.config or {}).get("name")
        if named not in (None, "", self.name):
            raise ValueError(f"config.name '{named}' differs from the model name '{self.name}'")
        return self

    @model_validator(mode="after")
    def _vllm_memory(self) -> Self:
        # The placer shares a GPU among models by memory_bytes (0 counts as small), and a
        # vLLM replica's share of the GPU is derived from it; without it vLLM would take
        # 90% of a GPU that other models are placed on.
        backend = self.backend or (self.config or {}).get("backend")
        if (
            backend == "vllm"
            and self.resources.device == "cuda"
            and not self.resources.memory_bytes
        ):
            raise ValueError(
                "a vllm model on a GPU needs resources.memory_bytes (one replica's weights "
                "plus KV cache): the placer shares GPUs by it and vLLM's "
                "gpu_memory_utilization is derived from it"
            )
        return self

    @model_validator(mode="after")
    def _ensemble_steps(self) -> Self:
        # The platform places an ensemble with the models its steps run, so it must know
        # them without reading the model store.
        config = self.config or {}
        if ensemble_config.ENSEMBLE_PLATFORM not in (self.platform, config.get("platform")):
            return self
        steps = config.get("ensemble_scheduling", {}).get("step") if config else None
        if not steps:
            raise ValueError(
                "an ensemble is registered with its config, whose ensemble_scheduling steps "
                "name the models placed with it"
            )
        return self


class ModelPatch(_Strict):
    """``PATCH /admin/v1/models/{name}``: change a registration; absent fields stay.

    A change of ``storage_uri``, ``config``, ``platform``, ``backend`` or ``resources``
    reloads the model's replicas in place; ``scaling`` applies from the next decision.
    """

    storage_uri: str | None = Field(default=None, min_length=1)
    platform: str | None = None
    backend: str | None = None
    config: dict[str, Any] | None = None
    bls_models: list[str] | None = Field(default=None, max_length=MAX_BLS_MODELS)
    scaling: ScalingPatch | None = None
    resources: ResourcesPatch | None = None

    _storage_uri = field_validator("storage_uri")(check_storage_uri)
    _config = field_validator("config")(check_config)
    _code = field_validator("backend", "platform")(check_model_code)
    _config_code = field_validator("config")(check_config_code)
    _bls_models = field_validator("bls_models")(check_bls_models)


def merge_scaling(current: dict[str, Any], patch: ScalingPatch | None) -> ScalingSpec | None:
    """``current`` scaling with ``patch`` applied, validated; None when nothing is asked.

    Raises ``SchemaValidationError`` naming ``scaling.<field>`` when the result is invalid.
    """
    if patch is None:
        return None
    changes = patch.model_dump(exclude_none=True)
    if not changes:
        return None
    try:
        return ScalingSpec.model_validate({**current, **changes})
    except ValidationError as exc:
        raise schema_error(exc, prefix=("scaling",)) from None


def schema_error(exc: ValidationError, *, prefix: tuple[str, ...] = ()) -> SchemaValidationError:
    """The ``SchemaValidationError`` for pydantic's ``exc``, each field as a dotted path."""
    errors = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(part) for part in (*prefix, *error["loc"])) or "body"
        message = str(error["msg"]).removeprefix("Value error, ")
        errors.append((path, message))
    return SchemaValidationError(errors=errors)


# ---- responses ----


class Replica(BaseModel):
    """One ready replica of a model."""

    worker_id: str
    url: str
    generation: int
    since: float = Field(description="Wall-clock seconds since the epoch")


class Failure(BaseModel):
    """Why the model's last load failed for good; no activation starts until its
    registration changes or it is loaded on purpose."""

    reason: str = Field(description="The worker's words for the failed load")
    failed_at: float = Field(description="Wall-clock seconds since the epoch")


class ModelStatus(BaseModel):
    """Where a model stands now."""

    state: ModelState
    replicas: list[Replica]
    sleeping: list[Replica] = Field(
        default_factory=list, description="Replicas asleep on their workers (LLM engines)"
    )
    served_versions: list[str] | None = Field(
        default=None,
        description="The model's numbered versions (its version folders, as its config's "
        "version_policy chose them) that a ready replica's worker says it serves; given "
        "when one model is read (not in lists), null when no replica is ready or its "
        "worker did not answer in time",
    )
    in_flight: int = Field(description="Requests in flight on all activators")
    last_request_at: float | None = Field(description="Wall-clock seconds since the epoch")
    last_activation: dict[str, Any] | None = Field(description="The newest cold-start timeline")
    failure: Failure | None = Field(
        default=None,
        description="Set when the model's load failed for good (state failed): calls to it "
        "are answered at once with this reason and nothing is retried until the "
        "registration changes or an explicit load",
    )


class ModelView(BaseModel):
    """A registered model with its status."""

    name: str
    storage_uri: str
    platform: str
    backend: str
    config: dict[str, Any] | None
    bls_models: list[str]
    scaling: ScalingSpec
    resources: ResourceSpec
    generation: int
    created_at: float
    status: ModelStatus


class ModelList(BaseModel):
    models: list[ModelView]


class Activations(BaseModel):
    """The newest cold-start timelines of a model, newest first."""

    model: str
    activations: list[dict[str, Any]]


class ReplicaSeconds(BaseModel):
    """Replica-seconds of one model (GPU-seconds on GPU pools, device-seconds on CPU)."""

    serving: float = Field(description="Loaded with requests in flight")
    idle: float = Field(description="Loaded without a request")
    loading: float = Field(description="Spent loading (cold starts and pre-warms)")


class UsageView(BaseModel):
    """What a model cost over [start, end) (wall-clock seconds; hourly buckets)."""

    model: str
    start: float
    end: float
    device: Device
    bucket_s: float = Field(description="Resolution: buckets overlapping the range count")
    replica_seconds: ReplicaSeconds
    activations: int
    cold_starts: int = Field(description="Activations a request waited for")
    cold_start_wait_s: float = Field(description="Time those requests waited, summed")


class WorkerView(BaseModel):
    """A runtime worker and the models it serves."""

    id: str
    url: str
    grpc_address: str = Field(
        default="", description="host:port of the worker's gRPC server; empty when it has none"
    )
    pool: str
    device: str
    memory_bytes: int
    state: str
    started_at: float
    models: list[str]
    details: dict[str, Any] = Field(description="Backend facts: a local worker's pid and log")


class WorkerList(BaseModel):
    workers: list[WorkerView]


class ErrorBody(BaseModel):
    """Every error answer."""

    error: str
    fields: list[str] | None = Field(
        default=None, description="422 only: dotted paths of the fields at fault"
    )
