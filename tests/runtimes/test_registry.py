"""runtime_class_for: backend, then platform, then files; clear errors otherwise. The
factory: each runtime gets the options its kind takes; capabilities are objects or None."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.base import ModelRuntime, RuntimeOptions
from runtimes.capabilities import Capabilities
from runtimes.llm.base import LLMRuntime
from runtimes.llm.hf import TransformersRuntime
from runtimes.llm.options import LLMOptions
from runtimes.onnx import OnnxRuntime
from runtimes.python_model import PythonRuntime
from runtimes.registry import RuntimeFactory, available_backends, runtime_class_for
from runtimes.torch import TorchRuntime

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _folder(tmp_path: Path, *files: str) -> Path:
    for name in files:
        (tmp_path / name).write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize(
    ("config", "files", "expected"),
    [
        pytest.param(ModelConfig(backend="onnxruntime"), (), OnnxRuntime, id="backend-onnx"),
        pytest.param(ModelConfig(backend="pytorch"), (), TorchRuntime, id="backend-pytorch"),
        pytest.param(ModelConfig(backend="python"), (), PythonRuntime, id="backend-python"),
        pytest.param(ModelConfig(platform="onnxruntime_onnx"), (), OnnxRuntime, id="platform-onnx"),
        pytest.param(
            ModelConfig(platform="pytorch_libtorch"), (), TorchRuntime, id="platform-libtorch"
        ),
        pytest.param(
            ModelConfig(platform="pytorch_export"), (), TorchRuntime, id="platform-export"
        ),
        pytest.param(
            ModelConfig(backend="onnxruntime", platform="onnxruntime_onnx"),
            (),
            OnnxRuntime,
            id="backend-and-platform-agree",
        ),
        pytest.param(ModelConfig(), ("model.onnx",), OnnxRuntime, id="file-onnx"),
        pytest.param(ModelConfig(), ("model.pt",), TorchRuntime, id="file-pt"),
        pytest.param(ModelConfig(), ("model.pt2",), TorchRuntime, id="file-pt2"),
        pytest.param(ModelConfig(), ("model.pt", "model.pt2"), TorchRuntime, id="file-pt-pt2"),
        pytest.param(ModelConfig(), ("model.py",), PythonRuntime, id="file-py"),
        pytest.param(
            ModelConfig(default_model_filename="net.onnx"), (), OnnxRuntime, id="default-filename"
        ),
        pytest.param(
            ModelConfig(backend="python"), ("model.onnx",), PythonRuntime, id="backend-beats-file"
        ),
        pytest.param(
            ModelConfig(), ("model.onnx", "labels.txt"), OnnxRuntime, id="other-files-ignored"
        ),
    ],
)
def test_runtime_class_for(
    tmp_path: Path, config: ModelConfig, files: tuple[str, ...], expected: type[ModelRuntime]
) -> None:
    if expected is TorchRuntime and not HAS_TORCH:
        pytest.skip("PyTorch is not installed")
    assert runtime_class_for(config, _folder(tmp_path, *files)) is expected


@pytest.mark.parametrize(
    ("config", "files", "message"),
    [
        pytest.param(
            ModelConfig(backend="tensorflow"), (), "unknown backend 'tensorflow'", id="backend"
        ),
        pytest.param(
            ModelConfig(platform="tensorrt_plan"),
            (),
            "unsupported platform 'tensorrt_plan'",
            id="platform",
        ),
        pytest.param(
            ModelConfig(backend="python", platform="onnxruntime_onnx"),
            (),
            "disagree",
            id="backend-platform-clash",
        ),
        pytest.param(ModelConfig(), (), "no model file", id="no-files"),
        pytest.param(ModelConfig(), ("model.onnx", "model.py"), "several backends", id="ambiguous"),
        pytest.param(
            ModelConfig(default_model_filename="net.bin"), (), "net.bin", id="unknown-suffix"
        ),
    ],
)
def test_runtime_class_for_errors(
    tmp_path: Path, config: ModelConfig, files: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        runtime_class_for(config, _folder(tmp_path, *files))


def test_no_version_folder_needs_the_config_to_say() -> None:
    assert runtime_class_for(ModelConfig(backend="onnxruntime"), None) is OnnxRuntime
    with pytest.raises(ValueError, match="set backend"):
        runtime_class_for(ModelConfig(), None)


def test_available_backends() -> None:
    backends = available_backends()
    assert backends == sorted(backends)
    assert {"onnxruntime", "python"} <= set(backends)
    assert ("pytorch" in backends) is HAS_TORCH


def test_runtimes_import_and_report_clearly_without_torch(tmp_path: Path) -> None:
    # A fresh interpreter where `import torch` fails, as on a server without the extra.
    script = textwrap.dedent(
        """
        import asyncio, sys
        from pathlib import Path
        sys.modules["torch"] = None
        from runtimes.errors import ModelLoadError
        from foundation.proto.model_config_pb2 import ModelConfig
        from runtimes.base import RuntimeOptions
        from runtimes.registry import available_backends, runtime_class_for
        from runtimes.torch import TorchRuntime

        print(available_backends())
        try:
            runtime_class_for(ModelConfig(backend="pytorch"), None)
        except ValueError as exc:
            print("registry:", exc)
        runtime = TorchRuntime(name="m", version=1, options=RuntimeOptions())
        try:
            asyncio.run(runtime.load(Path(sys.argv[1]), ModelConfig(), "cpu"))
        except ModelLoadError as exc:
            print("load:", exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "['onnxruntime', 'python']"
    assert "registry: backend 'pytorch' needs the 'torch' package" in lines[1]
    assert "load: load failed for model 'm': PyTorch is not installed" in lines[2]


def test_llm_engines_are_chosen_by_backend() -> None:
    from runtimes.llm.hf import TransformersRuntime
    from runtimes.llm.vllm import VllmRuntime

    if importlib.util.find_spec("transformers") is not None and HAS_TORCH:
        assert runtime_class_for(ModelConfig(backend="transformers"), None) is TransformersRuntime
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ValueError, match="needs the 'vllm' package"):
            runtime_class_for(ModelConfig(backend="vllm"), None)
    else:
        assert runtime_class_for(ModelConfig(backend="vllm"), None) is VllmRuntime


class _Spares:
    """A spare-engine pool that starts nothing and counts its closes."""

    def __init__(self) -> None:
        self.closes = 0

    def take(self) -> None:
        return None

    def refill(self) -> None:
        pass

    def close(self) -> None:
        self.closes += 1


@pytest.mark.parametrize("kind", ["transformers", "vllm"])
def test_the_factory_hands_llm_runtimes_their_own_options(kind: str) -> None:
    options, spares = RuntimeOptions(drain_timeout_s=1.5), _Spares()
    factory = RuntimeFactory(options, LLMOptions(spare_engines=spares))
    runtime = factory.create(kind, name="m", version=2)
    assert isinstance(runtime, LLMRuntime)
    assert (runtime.kind, runtime.name, runtime.version) == (kind, "m", 2)
    assert runtime.options is options
    assert runtime.llm_options.spare_engines is spares
    factory.close()
    assert spares.closes == 1


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("onnxruntime", OnnxRuntime), ("pytorch", TorchRuntime), ("python", PythonRuntime)],
)
def test_the_factory_builds_the_other_runtimes_with_the_generic_options(
    kind: str, expected: type[ModelRuntime]
) -> None:
    options = RuntimeOptions(intra_op_threads=2)
    factory = RuntimeFactory(options)
    runtime = factory.create(kind, name="m", version=1)
    assert type(runtime) is expected and runtime.options is options
    with pytest.raises(KeyError):
        factory.create("no-such-backend", name="m", version=1)
    factory.close()  # keeps nothing: nothing to stop


def test_capabilities_are_the_runtime_itself_or_none() -> None:
    plain = PythonRuntime(name="m", version=1, options=RuntimeOptions())
    assert plain.resolve_capabilities() == Capabilities()
    llm = TransformersRuntime(name="m", version=1, options=RuntimeOptions())
    offered = llm.resolve_capabilities()
    assert offered.generation is llm and offered.sleep is llm
    assert offered.health is llm and offered.generation_metrics is llm
