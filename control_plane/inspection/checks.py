"""Whether a worker could load a registered model, judged from its listing and small files.

:func:`check_registration` follows a worker's load step by step (the storage layout, the
config, the backend, the version policy, the model file, the ONNX graph's interface, a
Hugging Face folder's ``config.json``) and stops at the first step the worker would fail,
raising :class:`InvalidRegistrationError` with the message the worker's load would answer:
Triton's "failed to poll from model repository" for the folder and its config, "load
failed" for what a runtime refuses. It reads only through :class:`ModelFiles`, so every rule
is tested with an in-memory model.

What cannot be judged without the weights (a model that does not run, a Python model's
``initialize`` raising) is left to the load, whose permanent failures mark the model failed.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final

from control_plane.errors import InvalidRegistrationError, RegistrationCheckUnavailableError
from control_plane.inspection.files import LocationError, ModelFiles, StoredListing
from foundation import ensemble_config, model_config
from foundation.proto.model_config_pb2 import DataType, ModelConfig
from runtimes import registry

__all__ = ["SMALL_FILE_MAX_BYTES", "Registration", "check_registration", "poll_error"]

SMALL_FILE_MAX_BYTES: Final = 1 << 20
"""The most a check reads of one config file; larger ones are not judged."""

_NO_MODEL: Final = (
    "no model here: expected a Triton model folder (config.pbtxt and numeric "
    "version folders such as 1/model.onnx), a Hugging Face model folder (config.json, "
    "*.safetensors and the tokenizer files) or a single model file"
)
_HF_CONFIG: Final = "config.json"
_LLM_BACKENDS: Final = ("transformers", "vllm")
_CODE_BACKENDS: Final = ("python", "pytorch")

_MODEL_FILES: Final[Mapping[str, tuple[str, ...]]] = {
    "onnxruntime": ("model.onnx",),
    "pytorch": ("model.pt", "model.pt2"),
    "python": ("model.py",),
}
"""Backend -> the files a version folder may hold it in, when the config names none."""

_ORT_TYPES: Final[Mapping[str, str]] = {
    "BOOL": "tensor(bool)",
    "UINT8": "tensor(uint8)",
    "UINT16": "tensor(uint16)",
    "UINT32": "tensor(uint32)",
    "UINT64": "tensor(uint64)",
    "INT8": "tensor(int8)",
    "INT16": "tensor(int16)",
    "INT32": "tensor(int32)",
    "INT64": "tensor(int64)",
    "FP16": "tensor(float16)",
    "FP32": "tensor(float)",
    "FP64": "tensor(double)",
    "BYTES": "tensor(string)",
    "BF16": "tensor(bfloat16)",
}
"""Protocol datatype -> ONNX Runtime's type string (``runtimes.onnx.dtypes.ORT_TYPES``)."""


@dataclass(frozen=True)
class Registration:
    """What is registered, as a worker's load gets it."""

    name: str
    config: ModelConfig | None
    """The registration's config (with its backend and platform), which replaces any
    config.pbtxt; None to read the stored one."""
    allow_model_code: bool = True
    """False: the workers refuse a model that is code (Python, PyTorch)."""
    pool: str = "default"
    """The worker pool the model goes to, for messages."""
    pool_backends: Collection[str] | None = None
    """The backends that pool's workers can run; None when unknown (pods)."""


def poll_error(name: str, reason: str) -> str:
    """A worker's words for a load that failed before anything was built."""
    return f"failed to load '{name}', failed to poll from model repository: {reason}"


def _load_error(name: str, reason: str) -> str:
    return f"load failed for model '{name}': {reason}"


def _version_error(name: str, version: int, reason: str) -> str:
    return _load_error(name, f"version {version} is at UNAVAILABLE state: {reason};\n")


def check_registration(registration: Registration, files: ModelFiles) -> None:
    """Refuse a registration a worker could not load, in the worker's words.

    Raises:
        InvalidRegistrationError: the load would fail; the message is the worker's.
        RegistrationCheckUnavailableError: the store could not be read now.
    """
    name = registration.name
    try:
        _check(registration, files)
    except LocationError as exc:
        if exc.is_transient:
            raise RegistrationCheckUnavailableError(model=name, reason=exc.message) from None
        raise InvalidRegistrationError(model=name, message=poll_error(name, exc.message)) from None


def _check(registration: Registration, files: ModelFiles) -> None:
    name = registration.name
    listing = files.listing()
    layout = _layout(listing.entries)
    if layout is None:
        raise LocationError(f"cannot fetch '{listing.uri}': {_NO_MODEL}")
    is_hf = layout == "hf"

    def poll(reason: str) -> InvalidRegistrationError:
        return InvalidRegistrationError(model=name, message=poll_error(name, reason))

    if registration.config is not None:
        config = ModelConfig()
        config.CopyFrom(registration.config)
    elif not is_hf and listing.has("config.pbtxt"):
        text = files.read("config.pbtxt", max_bytes=SMALL_FILE_MAX_BYTES)
        if text is None:
            return
        try:
            config = model_config.parse_pbtxt(text.decode("utf-8", errors="replace"))
        except model_config.ConfigError as exc:
            raise poll(str(exc)) from None
    else:
        config = ModelConfig()
    config.name = name
    if config.platform == ensemble_config.ENSEMBLE_PLATFORM or config.HasField(
        "ensemble_scheduling"
    ):
        return  # checked against its steps' models by the admin schema and at load
    versions = _version_folders(listing, is_hf=is_hf)
    if not versions:
        raise poll(
            f"at least one version must be available under the version policy of model '{name}'"
        )
    newest = max(versions)
    newest_dir = _version_dir(listing, newest, is_hf=is_hf)
    if is_hf:
        _check_hf(name, config, files, listing)
        kind = config.backend or None
    else:
        try:
            kind = _backend(config, listing, newest_dir)
        except ValueError as exc:
            raise poll(str(exc)) from None
    if kind is not None:
        if not registration.allow_model_code and kind in _CODE_BACKENDS:
            raise poll(
                f"model '{name}' is code ({kind} backend) and this load does not allow model code"
            )
        backends = registration.pool_backends
        if backends is not None and kind not in backends:
            raise poll(
                f"backend '{kind}' is not available on the workers of pool "
                f"'{registration.pool}'; available backends: {sorted(backends)}"
            )
    try:
        selected = model_config.select_versions(versions, config, name)
        for tensor in config.output:
            if tensor.label_filename and not listing.has(tensor.label_filename):
                raise model_config.ConfigError(
                    f"label file '{tensor.label_filename}' not found in the folder of model "
                    f"'{PurePosixPath(listing.base).name}'"
                )
    except model_config.ConfigError as exc:
        raise poll(str(exc)) from None
    if kind is None or is_hf or kind in _LLM_BACKENDS:
        return
    for version in selected:
        missing = _missing_model_file(listing, version, config, kind)
        if missing is not None:
            raise InvalidRegistrationError(
                model=name, message=_version_error(name, version, missing)
            )
    if kind == "onnxruntime":
        _check_onnx(name, config, files, listing, newest, selected[0])


def _layout(entries: Sequence[str]) -> str | None:
    """``triton``, ``hf`` or None, by the rule of ``data_plane.storage.layout``."""
    has_hf_config = False
    for entry in entries:
        head, slash, _rest = entry.partition("/")
        if slash and model_config.is_version(head):
            return "triton"
        has_hf_config = has_hf_config or entry == _HF_CONFIG
    return "hf" if has_hf_config else None


def _version_folders(listing: StoredListing, *, is_hf: bool) -> list[int]:
    if is_hf:
        return [1]
    found = set()
    for entry in listing.entries:
        head, slash, _rest = entry.partition("/")
        # Triton ignores version folders with a leading zero (other than 0).
        if slash and model_config.is_version(head) and (head == "0" or head[0] != "0"):
            found.add(head)
    return [int(v) for v in found]


def _version_dir(listing: StoredListing, version: int, *, is_hf: bool) -> str:
    return listing.base if is_hf else f"{listing.base}/{version}"


def _version_names(listing: StoredListing) -> list[str]:
    names = set()
    for entry in listing.entries:
        head, slash, _rest = entry.partition("/")
        if slash and model_config.is_version(head):
            names.add(head)
    return sorted(names)


def _backend(config: ModelConfig, listing: StoredListing, newest_dir: str) -> str:
    """The backend the worker's runtime registry chooses; ValueError in its words."""
    runtime = registry.named_runtime_class(config)
    if runtime is None:
        newest = newest_dir.rsplit("/", 1)[-1]
        runtime = registry.file_runtime_class(config, listing.files_under(newest), newest_dir)
    return runtime.kind


def _missing_model_file(
    listing: StoredListing, version: int, config: ModelConfig, kind: str
) -> str | None:
    """Why version ``version`` has no file for ``kind`` to load, or None."""
    folder = next(v for v in _version_names(listing) if int(v) == version)
    present = set(listing.files_under(folder))
    candidates = (
        (config.default_model_filename,)
        if config.default_model_filename
        else _MODEL_FILES.get(kind, ())
    )
    if not candidates or any(c in present for c in candidates):
        return None
    where = f"{listing.base}/{folder}"
    if kind == "pytorch":
        return f"no {' or '.join(candidates)} in {where}"
    return f"{where}/{candidates[0]} does not exist"


def _check_onnx(
    name: str,
    config: ModelConfig,
    files: ModelFiles,
    listing: StoredListing,
    newest: int,
    first: int,
) -> None:
    """The config's tensors against the graph's, as ONNX Runtime's session would judge."""
    folder = next(v for v in _version_names(listing) if int(v) == newest)
    filename = config.default_model_filename or "model.onnx"
    if filename not in listing.files_under(folder):
        return
    try:
        graph = files.graph_interface(f"{folder}/{filename}")
    except ValueError as exc:
        raise InvalidRegistrationError(
            model=name, message=_load_error(name, f"cannot read {filename} as ONNX: {exc}")
        ) from None
    if graph is None:
        return
    for kind, entries, model in (
        ("input", config.input, graph.inputs),
        ("output", config.output, graph.outputs),
    ):
        names = [e.name for e in entries]
        for tensor in names:
            if tensor not in model:
                reason = (
                    f"configuration {kind} {tensor!r} is not a model {kind}; model {kind}s: "
                    f"{sorted(model)}"
                )
                raise InvalidRegistrationError(
                    model=name, message=_version_error(name, first, reason)
                )
        for entry in entries:
            if entry.data_type == DataType.TYPE_INVALID:
                continue
            declared = DataType.Name(entry.data_type).removeprefix("TYPE_")
            protocol = "BYTES" if declared == "STRING" else declared
            if _ORT_TYPES.get(protocol) != model[entry.name]:
                reason = (
                    f"configuration {kind} {entry.name!r} is "
                    f"{DataType.Name(entry.data_type)} but the model has {model[entry.name]}"
                )
                raise InvalidRegistrationError(
                    model=name, message=_version_error(name, first, reason)
                )


def _check_hf(name: str, config: ModelConfig, files: ModelFiles, listing: StoredListing) -> None:
    """A Hugging Face folder, by the rules of ``runtimes.llm.hf_folder.complete_config``.

    Whether its architecture is a causal LM is left to the load: a worker consults
    transformers' own list for that, which takes seconds to import.
    """

    def refuse(reason: str) -> InvalidRegistrationError:
        return InvalidRegistrationError(model=name, message=poll_error(name, reason))

    raw = files.read(_HF_CONFIG, max_bytes=SMALL_FILE_MAX_BYTES)
    if raw is None:
        return
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise refuse(f"config.json cannot be read: {exc}") from None
    architectures = document.get("architectures") if isinstance(document, dict) else None
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise refuse(
            "config.json has no 'architectures' list, so the model class is unknown "
            "(save_pretrained writes it)"
        )
    if not any(e.endswith(".safetensors") and "/" not in e for e in listing.entries):
        raise refuse(
            "the Hugging Face folder holds no *.safetensors weights (save_pretrained writes "
            "model.safetensors)"
        )
    backends = ", ".join(_LLM_BACKENDS)
    if config.platform:
        raise refuse(
            f"a Hugging Face folder is served by an LLM backend ({backends}), "
            f"not platform '{config.platform}'"
        )
    if config.backend and config.backend not in _LLM_BACKENDS:
        raise refuse(
            f"a Hugging Face folder is served by an LLM backend ({backends}), "
            f"not '{config.backend}'"
        )
