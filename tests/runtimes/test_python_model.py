"""PythonRuntime: the TritonPythonModel contract, instances, output checks, failures."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from runtimes.base import RuntimeOptions, RuntimeState
from runtimes.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    ModelNotReadyError,
)
from runtimes.python_model import PythonRuntime
from tests.models import (
    load_runtime,
    marker_model_source,
    read_config,
    state_of,
    write_python_model,
)

RECORDING_MODEL = """
import json
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"])
        name = args["model_instance_name"]
        (self.folder / f"args-{name}.json").write_text(json.dumps(args))
        self.name = name

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"] + 1}

    def finalize(self):
        (self.folder / f"finalized-{self.name}").touch()
"""

EXCLUSIVE_MODEL = """
import time

import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.index = float(args["model_instance_name"].rsplit("_", 1)[1])
        self.busy = False

    def execute(self, inputs):
        if self.busy:
            raise RuntimeError("instance used by two threads at once")
        self.busy = True
        try:
            time.sleep(0.2)
        finally:
            self.busy = False
        return {"OUTPUT0": np.full(inputs["INPUT0"].shape, self.index, np.float32)}
"""


def _our_modules() -> set[str]:
    return {name for name in sys.modules if name.startswith("_zeroserve_model_")}


@pytest.mark.anyio
async def test_default_model_doubles_then_unloads(tmp_path: Path) -> None:
    runtime = await load_runtime(PythonRuntime, write_python_model(tmp_path, "double"))
    assert state_of(runtime) is RuntimeState.READY
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    outputs = await runtime.infer({"INPUT0": x})

    np.testing.assert_array_equal(outputs["OUTPUT0"], x * 2)
    await runtime.unload()
    assert state_of(runtime) is RuntimeState.UNLOADED
    with pytest.raises(ModelNotReadyError):
        await runtime.infer({"INPUT0": x})


@pytest.mark.anyio
async def test_initialize_gets_triton_args_and_finalize_runs_at_unload(tmp_path: Path) -> None:
    model_dir = write_python_model(tmp_path, "rec", RECORDING_MODEL, instance_count=2)
    before = _our_modules()
    runtime = await load_runtime(PythonRuntime, model_dir)

    args = json.loads((model_dir / "args-rec_0.json").read_text())
    assert args["model_name"] == "rec"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(model_dir)
    config = json.loads(args["model_config"])
    assert config["max_batch_size"] == 8
    assert config["input"][0]["name"] == "INPUT0"
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [-1]  # a number, as Triton prints it
    assert (model_dir / "args-rec_1.json").exists()
    assert len(_our_modules() - before) == 1

    await runtime.unload()
    assert (model_dir / "finalized-rec_0").exists()
    assert (model_dir / "finalized-rec_1").exists()
    assert _our_modules() == before


@pytest.mark.anyio
async def test_each_instance_serves_one_batch_at_a_time(tmp_path: Path) -> None:
    model_dir = write_python_model(tmp_path, "excl", EXCLUSIVE_MODEL, instance_count=2)
    runtime = await load_runtime(PythonRuntime, model_dir)
    x = np.zeros((1, 1), np.float32)

    started = time.monotonic()
    results = await asyncio.gather(*(runtime.infer({"INPUT0": x}) for _ in range(4)))
    elapsed_s = time.monotonic() - started

    # Two instances, four 0.2 s batches: about 0.4 s in two waves, never 0.8 s in series.
    assert elapsed_s < 0.7
    assert {float(r["OUTPUT0"][0, 0]) for r in results} == {0.0, 1.0}
    await runtime.unload()


@pytest.mark.anyio
async def test_modules_may_use_dataclasses_with_postponed_annotations(tmp_path: Path) -> None:
    source = """
    from __future__ import annotations

    import dataclasses
    from typing import ClassVar


    @dataclasses.dataclass
    class Scale:
        factor: float
        kind: ClassVar[str] = "linear"


    class TritonPythonModel:
        def initialize(self, args):
            self.scale = Scale(3.0)

        def execute(self, inputs):
            return {"OUTPUT0": inputs["INPUT0"] * self.scale.factor}
    """
    runtime = await load_runtime(PythonRuntime, write_python_model(tmp_path, "dc", source))
    out = await runtime.infer({"INPUT0": np.ones((1, 2), np.float32)})
    np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 2), 3, np.float32))
    await runtime.unload()


@pytest.mark.anyio
async def test_str_outputs_become_bytes_and_extra_outputs_are_dropped(tmp_path: Path) -> None:
    source = """
    import numpy as np


    class TritonPythonModel:
        def execute(self, inputs):
            words = np.array([[w.decode().upper() for w in row] for row in inputs["INPUT0"]])
            return {"OUTPUT0": words, "DEBUG": np.zeros(1)}
    """
    model_dir = write_python_model(tmp_path, "upper", source, datatype="BYTES")
    runtime = await load_runtime(PythonRuntime, model_dir)

    out = await runtime.infer({"INPUT0": np.array([[b"ab", "\u00e9".encode()]], dtype=object)})

    assert list(out) == ["OUTPUT0"]
    assert out["OUTPUT0"].dtype == object
    assert out["OUTPUT0"].tolist() == [[b"AB", "\u00c9".encode()]]
    await runtime.unload()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        pytest.param(
            "raise ValueError('bad row')", InternalError, "ValueError: bad row", id="raises"
        ),
        pytest.param(
            "from data_plane.errors import InvalidArgumentError\n"
            "        raise InvalidArgumentError('row 3 is empty')",
            InvalidArgumentError,
            "row 3 is empty",
            id="raises-zeroserve-error",
        ),
        pytest.param("return {}", InternalError, "no output 'OUTPUT0'", id="missing-output"),
        pytest.param("return [1]", InternalError, "returned list", id="not-a-dict"),
        pytest.param(
            "return {'OUTPUT0': inputs['INPUT0'].astype('float64')}",
            InternalError,
            "float64",
            id="wrong-dtype",
        ),
    ],
)
async def test_bad_execute_results(
    tmp_path: Path, body: str, error: type[Exception], message: str
) -> None:
    source = f"""
class TritonPythonModel:
    def execute(self, inputs):
        {body}
"""
    runtime = await load_runtime(PythonRuntime, write_python_model(tmp_path, "bad", source))
    with pytest.raises(error, match=message):
        await runtime.infer({"INPUT0": np.ones((1, 2), np.float32)})
    # The instance went back to the pool: the next batch is served (and fails the same way).
    with pytest.raises(error):
        await runtime.infer({"INPUT0": np.ones((1, 2), np.float32)})
    await runtime.unload()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("source", "message"),
    [
        pytest.param("def broken(:\n", "SyntaxError", id="syntax-error"),
        pytest.param("raise RuntimeError('cannot load')\n", "cannot load", id="import-raises"),
        pytest.param("class Model:\n    pass\n", "TritonPythonModel", id="no-class"),
        pytest.param("class TritonPythonModel:\n    pass\n", "execute", id="no-execute"),
    ],
)
async def test_bad_model_file_fails_load_clearly(tmp_path: Path, source: str, message: str) -> None:
    before = _our_modules()
    model_dir = write_python_model(tmp_path, "broken", source)
    runtime = PythonRuntime(name="broken", version=1, options=RuntimeOptions())

    with pytest.raises(ModelLoadError, match=message):
        await runtime.load(model_dir / "1", read_config(model_dir), "cpu")

    assert state_of(runtime) is RuntimeState.FAILED
    assert _our_modules() == before
    await runtime.unload()


@pytest.mark.anyio
async def test_failed_initialize_finalizes_instances_already_built(tmp_path: Path) -> None:
    source = """
    from pathlib import Path


    class TritonPythonModel:
        def initialize(self, args):
            self.folder = Path(args["model_repository"])
            if args["model_instance_name"].endswith("_1"):
                raise OSError("no GPU for instance 1")

        def execute(self, inputs):
            return inputs

        def finalize(self):
            (self.folder / "finalized").touch()
    """
    model_dir = write_python_model(tmp_path, "half", source, instance_count=2)
    with pytest.raises(ModelLoadError, match="OSError: no GPU for instance 1"):
        await load_runtime(PythonRuntime, model_dir)
    assert (model_dir / "finalized").exists()


@pytest.mark.anyio
async def test_failing_finalize_is_logged_and_unload_completes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = """
    class TritonPythonModel:
        def execute(self, inputs):
            return {"OUTPUT0": inputs["INPUT0"]}

        def finalize(self):
            raise RuntimeError("finalize broke")
    """
    runtime = await load_runtime(PythonRuntime, write_python_model(tmp_path, "fin", source))
    with caplog.at_level(logging.ERROR, logger="runtimes.python_model"):
        await runtime.unload()
    assert state_of(runtime) is RuntimeState.UNLOADED
    assert "finalize() of Python model fin failed" in caplog.text
    assert "finalize broke" in caplog.text


@pytest.mark.anyio
async def test_missing_model_file_and_unknown_device(tmp_path: Path) -> None:
    model_dir = write_python_model(tmp_path, "m")
    with pytest.raises(ModelLoadError, match="tpu"):
        await load_runtime(PythonRuntime, model_dir, device="tpu")
    (model_dir / "1" / "model.py").unlink()
    with pytest.raises(ModelLoadError, match="does not exist"):
        await load_runtime(PythonRuntime, model_dir)


@pytest.mark.anyio
async def test_gpu_device_reaches_initialize(tmp_path: Path) -> None:
    model_dir = write_python_model(tmp_path, "rec", RECORDING_MODEL)
    runtime = await load_runtime(PythonRuntime, model_dir, device="cuda:3")
    args = json.loads((model_dir / "args-rec_0.json").read_text())
    assert (args["model_instance_kind"], args["model_instance_device_id"]) == ("GPU", "3")
    await runtime.unload()


@pytest.mark.anyio
async def test_unload_is_idempotent(tmp_path: Path) -> None:
    runtime = await load_runtime(PythonRuntime, write_python_model(tmp_path, "m"))
    await runtime.unload()
    await runtime.unload()
    assert state_of(runtime) is RuntimeState.UNLOADED


SLOW_INIT_MODEL = """
import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"])
        time.sleep(0.3)

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}

    def finalize(self):
        (self.folder / "finalized").touch()
"""


@pytest.mark.anyio
async def test_event_loop_runs_while_initialize_blocks(tmp_path: Path) -> None:
    model_dir = write_python_model(tmp_path, "slow", SLOW_INIT_MODEL)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    runtime = await load_runtime(PythonRuntime, model_dir)
    ticker.cancel()

    # A load run on the loop would have allowed a single tick in its 0.3 s.
    assert ticks >= 10
    await runtime.unload()


@pytest.mark.anyio
async def test_cancelled_load_finalizes_what_it_built(tmp_path: Path) -> None:
    model_dir = write_python_model(tmp_path, "slow", SLOW_INIT_MODEL)
    before = _our_modules()
    runtime = PythonRuntime(name="slow", version=1, options=RuntimeOptions())

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await runtime.load(model_dir / "1", read_config(model_dir), "cpu")

    assert state_of(runtime) is RuntimeState.FAILED
    # The worker finishes initialize() after the caller gave up; once it has exited, the
    # abandoned instances must have been finalized and the module dropped.
    for worker in [t for t in threading.enumerate() if t.name.startswith("python-slow_")]:
        await asyncio.to_thread(worker.join, 5)
    assert (model_dir / "finalized").exists()
    assert _our_modules() == before


@pytest.mark.anyio
@pytest.mark.parametrize("spelling", ["absolute", "dot-dot"])
async def test_default_model_filename_cannot_import_a_file_outside(
    tmp_path: Path, spelling: str
) -> None:
    # The config is built here, not parsed, so the runtime's own check is what stops it.
    marker = tmp_path / "marker"
    outside = tmp_path / "outside" / "evil.py"
    outside.parent.mkdir()
    outside.write_text(marker_model_source(marker))
    model_dir = write_python_model(tmp_path / "repo", "m")
    config = read_config(model_dir)
    config.default_model_filename = (
        str(outside) if spelling == "absolute" else "../../../outside/evil.py"
    )

    with pytest.raises(ModelLoadError, match="'default_model_filename' must be the name of a file"):
        await load_runtime(PythonRuntime, model_dir, config=config)

    assert not marker.exists()


@pytest.mark.anyio
async def test_a_version_folder_linked_outside_the_model_folder_is_refused(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "marker"
    outside = tmp_path / "outside" / "1"
    outside.mkdir(parents=True)
    (outside / "model.py").write_text(marker_model_source(marker))
    model_dir = write_python_model(tmp_path / "repo", "m", version=2)
    (model_dir / "1").symlink_to(outside, target_is_directory=True)
    (model_dir / "3").symlink_to(model_dir / "2", target_is_directory=True)

    with pytest.raises(ModelLoadError, match="outside the model folder"):
        await load_runtime(PythonRuntime, model_dir, version=1)
    assert not marker.exists()
    # A link between versions of the same model stays usable.
    runtime = await load_runtime(PythonRuntime, model_dir, version=3)
    await runtime.unload()
