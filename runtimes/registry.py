"""Which :class:`~runtimes.base.ModelRuntime` serves a model: by backend, platform, then files;
and the factory that builds one with the options its kind takes.

The order follows Triton: an explicit ``backend`` wins, then a ``platform`` name, then the
files in the version folder (``default_model_filename`` first, then the default names).
Runtime modules are imported here, but none of them imports its optional engine (torch)
at import time, so this module imports without the extras.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Final

from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.base import ModelRuntime, RuntimeOptions
from runtimes.llm.base import LLMRuntime
from runtimes.llm.engine_process.client import SpareEngines
from runtimes.llm.hf import TransformersRuntime
from runtimes.llm.options import LLMOptions
from runtimes.llm.vllm import VllmRuntime
from runtimes.onnx import OnnxRuntime
from runtimes.python_model import PythonRuntime
from runtimes.torch import EXPORT_FILENAME, TORCHSCRIPT_FILENAME, TorchRuntime

_LLM_BACKENDS: Final[Mapping[str, type[LLMRuntime]]] = MappingProxyType(
    {runtime.kind: runtime for runtime in (TransformersRuntime, VllmRuntime)}
)
"""Config ``backend`` -> LLM runtime class (these take :class:`LLMOptions` too)."""

_BACKENDS: Final[Mapping[str, type[ModelRuntime]]] = MappingProxyType(
    {
        **{runtime.kind: runtime for runtime in (OnnxRuntime, TorchRuntime, PythonRuntime)},
        **_LLM_BACKENDS,
    }
)
"""Config ``backend`` -> runtime class. LLM engines are chosen by backend only (as Triton's
vLLM backend is): their folders hold a Hugging Face model, not a file named for them."""

_PLATFORMS: Final[Mapping[str, type[ModelRuntime]]] = MappingProxyType(
    {
        "onnxruntime_onnx": OnnxRuntime,
        "pytorch_libtorch": TorchRuntime,
        # Not a Triton platform name: Triton serves torch.export programs through
        # `backend: "pytorch"`. Accepted so that a platform-only config can say so.
        "pytorch_export": TorchRuntime,
    }
)
"""Config ``platform`` -> runtime class (Triton's names where Triton has one)."""

_SUFFIXES: Final[Mapping[str, type[ModelRuntime]]] = MappingProxyType(
    {".onnx": OnnxRuntime, ".pt": TorchRuntime, ".pt2": TorchRuntime, ".py": PythonRuntime}
)
"""Model file suffix -> runtime class, for ``default_model_filename``."""

_DEFAULT_FILES: Final[Mapping[str, type[ModelRuntime]]] = MappingProxyType(
    {
        OnnxRuntime.model_filename: OnnxRuntime,
        TORCHSCRIPT_FILENAME: TorchRuntime,
        EXPORT_FILENAME: TorchRuntime,
        PythonRuntime.model_filename: PythonRuntime,
    }
)
"""Default file names a version folder may hold -> runtime class."""

_ENGINE_MODULES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        OnnxRuntime.kind: ("onnxruntime",),
        TorchRuntime.kind: ("torch",),
        PythonRuntime.kind: (),
        TransformersRuntime.kind: ("transformers", "torch"),
        VllmRuntime.kind: ("vllm",),
    }
)
"""Backend -> the packages its engine needs (none: nothing beyond the server)."""


class RuntimeFactory:
    """Builds runtimes, each with the node-level options its kind takes: ``options`` for
    every runtime, ``llm_options`` for the LLM runtimes alone.

    Owns what the options hold (the spare engine process): :meth:`close` stops it.
    """

    def __init__(self, options: RuntimeOptions, llm_options: LLMOptions | None = None) -> None:
        self.options = options
        self.llm_options = llm_options or LLMOptions()

    @classmethod
    def for_server(cls, options: RuntimeOptions) -> RuntimeFactory:
        """A factory for a serving node: LLM runtimes start their engine in a spare process
        kept started ahead of each load (none is started before the first one)."""
        return cls(options, LLMOptions(spare_engines=SpareEngines()))

    def create(self, kind: str, *, name: str, version: int) -> ModelRuntime:
        """A new runtime for version ``version`` of model ``name``, of backend ``kind`` (as
        :func:`runtime_class_for` chose it); raises KeyError for a backend not known here."""
        llm_runtime = _LLM_BACKENDS.get(kind)
        if llm_runtime is not None:
            return llm_runtime(
                name=name, version=version, options=self.options, llm_options=self.llm_options
            )
        return _BACKENDS[kind](name=name, version=version, options=self.options)

    def close(self) -> None:
        """Stop the spare engine process, if any (blocking, bounded); later loads of LLM
        runtimes start their engine without one."""
        spares = self.llm_options.spare_engines
        if spares is not None:
            spares.close()


def available_backends() -> list[str]:
    """Backend names whose engine package is installed, sorted."""
    return sorted(kind for kind in _BACKENDS if _is_installed(kind))


def runtime_class_for(config: ModelConfig, version_dir: Path | None) -> type[ModelRuntime]:
    """The runtime class for ``config``, looking into ``version_dir`` if the config is silent.

    Raises ValueError naming what was looked at when the backend or platform is unknown,
    disagree with each other, the engine is not installed, or the files match no runtime
    or more than one.
    """
    runtime = _from_config(config)
    if runtime is None:
        runtime = _from_files(config, version_dir)
    if not _is_installed(runtime.kind):
        missing = [m for m in _ENGINE_MODULES[runtime.kind] if not _has_module(m)]
        names = ", ".join(repr(m) for m in missing)
        raise ValueError(
            f"backend {runtime.kind!r} needs the {names} package{'s' if len(missing) > 1 else ''}"
            f", which is not installed; available backends: {available_backends()}"
        )
    return runtime


def named_runtime_class(config: ModelConfig) -> type[ModelRuntime] | None:
    """The runtime class ``config``'s ``backend`` or ``platform`` names; None when it names
    neither. Looks at no file and needs no engine installed; raises ValueError as
    :func:`runtime_class_for` does for unknown or disagreeing names."""
    return _from_config(config)


def _from_config(config: ModelConfig) -> type[ModelRuntime] | None:
    by_backend = by_platform = None
    if config.backend:
        by_backend = _BACKENDS.get(config.backend)
        if by_backend is None:
            raise ValueError(
                f"unknown backend {config.backend!r}; supported backends: {sorted(_BACKENDS)}"
            )
    if config.platform:
        by_platform = _PLATFORMS.get(config.platform)
        if by_platform is None:
            raise ValueError(
                f"unsupported platform {config.platform!r}; supported platforms: "
                f"{sorted(_PLATFORMS)} (or set backend: {sorted(_BACKENDS)})"
            )
    if by_backend is not None and by_platform is not None and by_backend is not by_platform:
        raise ValueError(
            f"backend {config.backend!r} and platform {config.platform!r} disagree; "
            "set only one of them"
        )
    return by_backend or by_platform


def _from_files(config: ModelConfig, version_dir: Path | None) -> type[ModelRuntime]:
    if version_dir is None:
        if config.default_model_filename:
            return file_runtime_class(config, (), "")
        raise ValueError("the configuration names no backend or platform; set backend")
    present = [name for name in _DEFAULT_FILES if (version_dir / name).is_file()]
    return file_runtime_class(config, present, str(version_dir))


def file_runtime_class(
    config: ModelConfig, present: Collection[str], folder: str
) -> type[ModelRuntime]:
    """The runtime class the files choose when ``config`` names no backend or platform:
    ``default_model_filename``'s suffix, else the default file names among ``present`` (the
    file names in the version folder ``folder``, which messages name). Looks at no file and
    needs no engine installed; raises ValueError as :func:`runtime_class_for` does."""
    if config.default_model_filename:
        runtime = _SUFFIXES.get(PurePosixPath(config.default_model_filename).suffix)
        if runtime is None:
            raise ValueError(
                f"cannot tell the backend of default_model_filename "
                f"{config.default_model_filename!r}; set backend in config.pbtxt"
            )
        return runtime
    found = {name: runtime for name, runtime in _DEFAULT_FILES.items() if name in present}
    runtimes = set(found.values())
    if len(runtimes) == 1:
        return runtimes.pop()
    if not runtimes:
        raise ValueError(
            f"no backend or platform in the configuration and no model file in {folder} "
            f"(looked for {', '.join(_DEFAULT_FILES)})"
        )
    raise ValueError(
        f"{folder} holds files of several backends ({', '.join(sorted(found))}); "
        "set backend in config.pbtxt"
    )


def _is_installed(kind: str) -> bool:
    return all(_has_module(module) for module in _ENGINE_MODULES[kind])


def _has_module(module: str) -> bool:
    # find_spec raises ValueError for a module set to None in sys.modules (a blocked import).
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:
        return False
