"""Python-backend models written as Triton's documentation writes them, to load unchanged
into zeroserve and into real Triton.

Each model is a ``config.pbtxt`` and a ``1/model.py`` that imports
``triton_python_backend_utils as pb_utils`` and defines ``TritonPythonModel`` with
``execute(self, requests)``. Kept as text here (not as ``model.py`` files in the tree) so
that the linters and mypy, which cannot import ``triton_python_backend_utils``, leave them
alone. :func:`write_repository` lays them out as a model repository.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TritonModel:
    """One model folder: its configuration and its ``model.py``."""

    config: str
    source: str


ADD_SUB_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
input [ {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

ADD_SUB = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1]
            )
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

BATCHED_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: 300000 }}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

# Doubles each request's rows and says how many requests shared the execute call; a
# negative first element answers that request alone with an error whose code a request
# parameter names.
BATCHED = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.flat[0] < 0:
                code_name = json.loads(request.parameters()).get("error_code", "INTERNAL")
                error = pb_utils.TritonError(
                    "negative input in request " + request.request_id(),
                    getattr(pb_utils.TritonError, code_name),
                )
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            count = np.full((x.shape[0], 1), len(requests), dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32)),
                        pb_utils.Tensor("REQUESTS", count),
                    ]
                )
            )
        return responses
"""

AUTO_COMPLETE_CONFIG = """
name: "{name}"
backend: "python"
"""

AUTO_COMPLETE = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
        ]
        outputs = [
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
        ]
        config = auto_complete_model_config.as_dict()
        input_names = [input["name"] for input in config["input"]]
        output_names = [output["name"] for output in config["output"]]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            if output["name"] not in output_names:
                auto_complete_model_config.add_output(output)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        self.output_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.output_dtype)),
                        pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.output_dtype)),
                    ]
                )
            )
        return responses
"""

ONE_INPUT_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

EXECUTE_RAISES = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("this model cannot execute")
"""

WRONG_COUNT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return []
"""

NOT_A_LIST = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return None if False else "responses"
"""

CRASH = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        os._exit(3)
"""

# Sleeps for INPUT0 seconds, then echoes it.
SLEEPY = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(float(x[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

# Spins in pure Python (holding the GIL, never sleeping) for INPUT0 seconds.
GIL_HOG = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            end = time.monotonic() + float(x[0])
            spins = 0
            while time.monotonic() < end:
                spins += 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

INIT_ERROR = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot initialize " + args["model_name"])

    def execute(self, requests):
        return []
"""

SYNTAX_ERROR = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests)
        return []
"""

# Keeps 64 MiB more of touched memory after every execute.
LEAKY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        self.kept.append(np.ones(64 * 1024 * 1024, dtype=np.uint8))
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

REQUEST_INFO_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "ID" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "CORRELATION" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "REQUESTED" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

# Answers with what pb_utils tells it about each request and with its initialize args.
REQUEST_INFO = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        config = json.loads(args["model_config"])
        self.args["model_config"] = sorted(config)
        self.args["model_repository"] = args["model_repository"].rsplit("/", 1)[-1]

    def execute(self, requests):
        responses = []
        for request in requests:
            def text(name, value):
                return pb_utils.Tensor(name, np.array([str(value).encode()], dtype=np.object_))

            responses.append(
                pb_utils.InferenceResponse(
                    [
                        text("ID", request.request_id()),
                        text("CORRELATION", repr(request.correlation_id())),
                        text("PARAMETERS", request.parameters()),
                        text("REQUESTED", ",".join(sorted(request.requested_output_names()))),
                        text("ARGS", json.dumps(self.args, sort_keys=True)),
                    ]
                )
            )
        return responses
"""

STRINGS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "LENGTHS" data_type: TYPE_INT64 dims: [ -1 ] }} ]
"""

STRINGS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array(
                [t.decode().upper().encode() for t in text.reshape(-1)], dtype=np.object_
            )
            lengths = np.array([len(t) for t in text.reshape(-1)], dtype=np.int64)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("UPPER", upper.reshape(text.shape)),
                        pb_utils.Tensor("LENGTHS", lengths.reshape(text.shape)),
                    ]
                )
            )
        return responses
"""

# Answers only OUTPUT0 of add_sub's two outputs.
PARTIAL_OUTPUTS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", in_0)]))
        return responses
"""

WHOAMI_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "PREFIX" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "CANCELLED" data_type: TYPE_BOOL dims: [ 1 ] }} ]
output [ {{ name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
"""

# Says which process and Python it runs in, whether the request was cancelled, and logs;
# sleeps INPUT0 seconds first.
WHOAMI = """
import os
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(float(x[0]))
            pb_utils.Logger.log_info("whoami served " + request.request_id())
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                        pb_utils.Tensor("PREFIX", np.array([sys.prefix.encode()], dtype=object)),
                        pb_utils.Tensor("CANCELLED", np.array([request.is_cancelled()])),
                        pb_utils.Tensor("INSTANCE", np.array([self.instance], dtype=object)),
                    ]
                )
            )
        return responses
"""

THREADS_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "PYTHON_THREADS" data_type: TYPE_INT64 dims: [ -1 ] }} ]
"""

# Starts native threads (an ONNX Runtime session with an intra-op pool of two) and a Python
# thread of its own; answers its process id and the ids of every Python thread. Not among
# MODELS, which real Triton also loads: its Python has no onnx.
THREADS = """
import os
import threading

import numpy as np
import onnx
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from onnx import TensorProto, helper


class TritonPythonModel:
    def initialize(self, args):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["X"], ["Y"])],
            "relu",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self.session = ort.InferenceSession(model.SerializeToString(), options)
        self.stop = threading.Event()
        self.worker = threading.Thread(target=self.stop.wait, name="model-worker")
        self.worker.start()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.session.run(None, {"X": x})
            ids = [t.native_id for t in threading.enumerate()]
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                        pb_utils.Tensor("PYTHON_THREADS", np.array(ids, dtype=np.int64)),
                    ]
                )
            )
        return responses

    def finalize(self):
        self.stop.set()
"""

MODELS: dict[str, TritonModel] = {
    "add_sub": TritonModel(ADD_SUB_CONFIG, ADD_SUB),
    "batched": TritonModel(BATCHED_CONFIG, BATCHED),
    "auto_complete": TritonModel(AUTO_COMPLETE_CONFIG, AUTO_COMPLETE),
    "execute_raises": TritonModel(ONE_INPUT_CONFIG, EXECUTE_RAISES),
    "wrong_count": TritonModel(ONE_INPUT_CONFIG, WRONG_COUNT),
    "not_a_list": TritonModel(ONE_INPUT_CONFIG, NOT_A_LIST),
    "crash": TritonModel(ONE_INPUT_CONFIG, CRASH),
    "sleepy": TritonModel(ONE_INPUT_CONFIG, SLEEPY),
    "gil_hog": TritonModel(ONE_INPUT_CONFIG, GIL_HOG),
    "init_error": TritonModel(ONE_INPUT_CONFIG, INIT_ERROR),
    "syntax_error": TritonModel(ONE_INPUT_CONFIG, SYNTAX_ERROR),
    "leaky": TritonModel(ONE_INPUT_CONFIG, LEAKY),
    "request_info": TritonModel(REQUEST_INFO_CONFIG, REQUEST_INFO),
    "strings": TritonModel(STRINGS_CONFIG, STRINGS),
    "partial_outputs": TritonModel(ADD_SUB_CONFIG, PARTIAL_OUTPUTS),
    "whoami": TritonModel(WHOAMI_CONFIG, WHOAMI),
}
"""Model name -> folder contents; the config's ``{name}`` is the folder's name."""
THREADS_MODEL = TritonModel(THREADS_CONFIG, THREADS)


def write_model(root: Path, name: str, *, as_name: str | None = None) -> Path:
    """Write model ``name`` into ``root`` (as ``as_name`` if given); returns its folder."""
    model = MODELS[name]
    folder = root / (as_name or name)
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(model.config.format(name=as_name or name))
    (folder / "1" / "model.py").write_text(model.source)
    return folder


def write_repository(root: Path, names: Iterable[str]) -> Path:
    """A model repository at ``root`` holding the named models."""
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        write_model(root, name)
    return root
