"""BLS and decoupled Python-backend models, written as Triton's Python-backend examples
write them (``examples/bls``, ``examples/bls_decoupled``, ``examples/decoupled``), to load
unchanged into zeroserve and into real Triton.

As in :mod:`tests.runtimes.python_backend.triton_models`, each model is a config and a
``model.py`` kept as text; :func:`write_repository` lays them out. The repository also
holds Triton's ``add_sub`` (the model the BLS examples call).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.runtimes.python_backend.triton_models import (
    ADD_SUB,
    ADD_SUB_CONFIG,
    TritonModel,
)

REPEAT_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: True }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
input [ {{ name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }} ]
input [ {{ name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

REPEAT = """
import json
import threading
import time

import numpy

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        using_decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        if not using_decoupled:
            raise pb_utils.TritonModelException(
                "the model `{}` can generate any number of responses per request, enable "
                "decoupled transaction policy in model configuration to serve this "
                "model".format(args["model_name"])
            )
        out_config = pb_utils.get_output_config_by_name(model_config, "OUT")
        idx_config = pb_utils.get_output_config_by_name(model_config, "IDX")
        self.out_dtype = pb_utils.triton_string_to_numpy(out_config["data_type"])
        self.idx_dtype = pb_utils.triton_string_to_numpy(idx_config["data_type"])
        self.inflight_thread_count = 0
        self.inflight_thread_count_lck = threading.Lock()

    def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException("unsupported batch size " + len(requests))
        in_input = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        delay_input = pb_utils.get_input_tensor_by_name(requests[0], "DELAY").as_numpy()
        if in_input.shape != delay_input.shape:
            raise pb_utils.TritonModelException(
                f"expected IN and DELAY shape to match, got {list(in_input.shape)} and "
                f"{list(delay_input.shape)}."
            )
        thread = threading.Thread(
            target=self.response_thread,
            args=(requests[0].get_response_sender(), in_input, delay_input),
        )
        thread.daemon = True
        with self.inflight_thread_count_lck:
            self.inflight_thread_count += 1
        thread.start()
        wait_input = pb_utils.get_input_tensor_by_name(requests[0], "WAIT").as_numpy()
        time.sleep(wait_input[0] / 1000)
        return None

    def response_thread(self, response_sender, in_input, delay_input):
        for idx in range(in_input.size):
            in_value = in_input[idx]
            delay_value = delay_input[idx]
            time.sleep(delay_value / 1000)
            idx_output = pb_utils.Tensor("IDX", numpy.array([idx], self.idx_dtype))
            out_output = pb_utils.Tensor("OUT", numpy.array([in_value], self.out_dtype))
            response = pb_utils.InferenceResponse(output_tensors=[idx_output, out_output])
            response_sender.send(response)
        response_sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.inflight_thread_count_lck:
            self.inflight_thread_count -= 1

    def finalize(self):
        inflight_threads = True
        while inflight_threads:
            with self.inflight_thread_count_lck:
                inflight_threads = self.inflight_thread_count != 0
            if inflight_threads:
                time.sleep(0.1)
"""

SQUARE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: True }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

SQUARE = """
import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("square_int32 must be decoupled")
        self.inflight_thread_count = 0
        self.inflight_thread_count_lck = threading.Lock()

    def execute(self, requests):
        for request in requests:
            self.process_request(request)
        return None

    def process_request(self, request):
        thread = threading.Thread(
            target=self.response_thread,
            args=(
                request.get_response_sender(),
                pb_utils.get_input_tensor_by_name(request, "IN").as_numpy(),
            ),
        )
        thread.daemon = True
        with self.inflight_thread_count_lck:
            self.inflight_thread_count += 1
        thread.start()

    def response_thread(self, response_sender, in_input):
        for idx in range(in_input[0]):
            out_output = pb_utils.Tensor("OUT", np.array([in_input[0]], np.int32))
            response = pb_utils.InferenceResponse(output_tensors=[out_output])
            response_sender.send(response)
        response_sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.inflight_thread_count_lck:
            self.inflight_thread_count -= 1

    def finalize(self):
        inflight_threads = True
        while inflight_threads:
            with self.inflight_thread_count_lck:
                inflight_threads = self.inflight_thread_count != 0
            if inflight_threads:
                time.sleep(0.1)
"""

BLS_SYNC_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }} ]
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
input [ {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

BLS_SYNC = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME")
            model_name_string = model_name.as_numpy()[0]
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name_string,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            inference_response = pb_utils.InferenceResponse(
                output_tensors=infer_response.output_tensors()
            )
            responses.append(inference_response)
        return responses
"""

BLS_ASYNC_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
input [ {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
parameters {{ key: "models" value: {{ string_value: "{models}" }} }}
"""

BLS_ASYNC = """
import asyncio
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        names = self.model_config["parameters"]["models"]["string_value"]
        self.model_names = names.split(",")

    async def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            inference_response_awaits = []
            for model_name in self.model_names:
                infer_request = pb_utils.InferenceRequest(
                    model_name=model_name,
                    requested_output_names=["OUTPUT0", "OUTPUT1"],
                    inputs=[in_0, in_1],
                )
                inference_response_awaits.append(infer_request.async_exec())
            inference_responses = await asyncio.gather(*inference_response_awaits)
            for infer_response in inference_responses:
                if infer_response.has_error():
                    raise pb_utils.TritonModelException(infer_response.error().message())
            output0_tensor = pb_utils.get_output_tensor_by_name(
                inference_responses[0], "OUTPUT0"
            )
            output1_tensor = pb_utils.get_output_tensor_by_name(
                inference_responses[1], "OUTPUT1"
            )
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[output0_tensor, output1_tensor]
            )
            responses.append(inference_response)
        return responses
"""

BLS_DECOUPLED_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

BLS_DECOUPLED_ASYNC = """
import asyncio
import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])

    async def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException("unsupported batch size " + len(requests))
        response_num = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        inference_response_awaits = []
        for _ in range(2):
            infer_request = pb_utils.InferenceRequest(
                model_name="square_int32",
                inputs=[response_num],
                requested_output_names=["OUT"],
            )
            inference_response_awaits.append(infer_request.async_exec(decoupled=True))
        async_responses = await asyncio.gather(*inference_response_awaits)
        response_sum = np.array([0])
        for infer_responses in async_responses:
            for infer_response in infer_responses:
                if infer_response.has_error():
                    raise pb_utils.TritonModelException(infer_response.error().message())
                if len(infer_response.output_tensors()) > 0:
                    response_sum += pb_utils.get_output_tensor_by_name(
                        infer_response, "OUT"
                    ).as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", response_sum)])]
"""

BLS_DECOUPLED_SYNC = """
import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            response_num = pb_utils.get_input_tensor_by_name(request, "IN")
            infer_request = pb_utils.InferenceRequest(
                model_name="square_int32",
                inputs=[response_num],
                requested_output_names=["OUT"],
            )
            response_sum = np.array([0], np.int32)
            count = 0
            for infer_response in infer_request.exec(decoupled=True):
                if infer_response.has_error():
                    raise pb_utils.TritonModelException(infer_response.error().message())
                count += 1
                if len(infer_response.output_tensors()) > 0:
                    response_sum += pb_utils.get_output_tensor_by_name(
                        infer_response, "OUT"
                    ).as_numpy()
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", response_sum)])
            )
        return responses
"""

BLS_PROBE_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }} ]
input [ {{ name: "INPUT_NAME" data_type: TYPE_STRING dims: [ 1 ] }} ]
input [ {{ name: "DECOUPLED" data_type: TYPE_BOOL dims: [ 1 ] }} ]
output [ {{ name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

BLS_PROBE = '''
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls MODEL_NAME with one FP32 [4] input named INPUT_NAME and answers with the
    first error the call gave (text and code; "" and -1 when none) and the number of
    responses."""

    def execute(self, requests):
        responses = []
        for request in requests:
            model = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            name = pb_utils.get_input_tensor_by_name(request, "INPUT_NAME").as_numpy()[0]
            decoupled = bool(pb_utils.get_input_tensor_by_name(request, "DECOUPLED").as_numpy()[0])
            data = np.arange(4, dtype=np.float32)
            call = pb_utils.InferenceRequest(
                model_name=model.decode(),
                requested_output_names=[],
                inputs=[pb_utils.Tensor(name.decode(), data)],
            )
            answers = list(call.exec(decoupled=True)) if decoupled else [call.exec()]
            errors = [a.error() for a in answers if a.has_error()]
            text = errors[0].message() if errors else ""
            code = int(errors[0].code()) if errors else -1
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("ERROR", np.array([text.encode()], dtype=object)),
                        pb_utils.Tensor("CODE", np.array([code], dtype=np.int32)),
                        pb_utils.Tensor("COUNT", np.array([len(answers)], dtype=np.int32)),
                    ]
                )
            )
        return responses
'''

SENDER_RULES_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: True }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

SENDER_RULES = '''
import numpy as np

import triton_python_backend_utils as pb_utils


def text(error):
    return pb_utils.Tensor("ERROR", np.array([str(error).encode()], dtype=object))


class TritonPythonModel:
    """Breaks one of the response sender's rules (IN selects which) and answers with the
    error text it met: 0 sends after the final flag, 1 sends an unknown flag, 2 sends no
    response without the final flag, 3 returns a list from a decoupled execute."""

    def execute(self, requests):
        for request in requests:
            case = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if case == 3:
                return [pb_utils.InferenceResponse([])]
            try:
                if case == 0:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    sender.send(pb_utils.InferenceResponse([]))
                elif case == 1:
                    sender.send(pb_utils.InferenceResponse([]), flags=4)
                else:
                    sender.send()
            except Exception as exc:
                if case != 0:
                    sender.send(pb_utils.InferenceResponse([text(exc)]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    pb_utils.Logger.log_info(str(exc))
        return None
'''

DECOUPLED_ERRORS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: True }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

DECOUPLED_ERRORS = """
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if n < 0:
                raise pb_utils.TritonModelException("negative count")
            sender = request.get_response_sender()
            out = pb_utils.Tensor("OUT", np.array([n], np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
            code = pb_utils.TritonError.INVALID_ARG
            failure = pb_utils.TritonError("second response failed", code)
            sender.send(
                pb_utils.InferenceResponse(error=failure),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""

COUNTDOWN_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: True }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

COUNTDOWN = """
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Calls itself through BLS with IN - 1 until 0, and answers with the sum of the
    counts (recursion on one instance: the decoupled async execute runs in the
    background, so the instance takes the inner call while the outer one waits).\"\"\"

    async def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            total = n
            if n > 0:
                call = pb_utils.InferenceRequest(
                    model_name="countdown",
                    requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", np.array([n - 1], np.int32))],
                )
                for response in await call.async_exec(decoupled=True):
                    if response.has_error():
                        raise pb_utils.TritonModelException(response.error().message())
                    if response.output_tensors():
                        out = pb_utils.get_output_tensor_by_name(response, "OUT")
                        total += int(out.as_numpy()[0])
            sender = request.get_response_sender()
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([total], np.int32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""

CANCELLABLE = """
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Sends a response every 20 ms until its client cancels (at most IN of them), then
    a last one saying whether it saw the cancellation.\"\"\"

    def initialize(self, args):
        self.seen = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            threading.Thread(target=self.run, args=(request, n), daemon=True).start()
        return None

    def run(self, request, n):
        sender = request.get_response_sender()
        for i in range(n):
            if request.is_cancelled() or sender.is_cancelled():
                pb_utils.Logger.log_info(f"cancelled after {i} responses")
                break
            out = pb_utils.Tensor("OUT", np.array([i], np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
            time.sleep(0.02)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

MODELS: dict[str, TritonModel] = {
    "add_sub": TritonModel(ADD_SUB_CONFIG, ADD_SUB),
    "add_sub_copy": TritonModel(ADD_SUB_CONFIG, ADD_SUB),
    "repeat_int32": TritonModel(REPEAT_CONFIG, REPEAT),
    "square_int32": TritonModel(SQUARE_CONFIG, SQUARE),
    "bls_sync": TritonModel(BLS_SYNC_CONFIG, BLS_SYNC),
    "bls_async": TritonModel(
        BLS_ASYNC_CONFIG.replace("{models}", "add_sub_copy,add_sub"), BLS_ASYNC
    ),
    "bls_decoupled_async": TritonModel(BLS_DECOUPLED_CONFIG, BLS_DECOUPLED_ASYNC),
    "bls_decoupled_sync": TritonModel(BLS_DECOUPLED_CONFIG, BLS_DECOUPLED_SYNC),
    "bls_probe": TritonModel(BLS_PROBE_CONFIG, BLS_PROBE),
    "sender_rules": TritonModel(SENDER_RULES_CONFIG, SENDER_RULES),
    "decoupled_errors": TritonModel(DECOUPLED_ERRORS_CONFIG, DECOUPLED_ERRORS),
    "countdown": TritonModel(COUNTDOWN_CONFIG, COUNTDOWN),
    "cancellable": TritonModel(DECOUPLED_ERRORS_CONFIG, CANCELLABLE),
}
"""Model name -> folder contents; the config's ``{name}`` is the folder's name."""


def write_repository(root: Path, names: Iterable[str] = MODELS) -> Path:
    """A model repository at ``root`` holding the named models."""
    for name in names:
        model = MODELS[name]
        folder = root / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(model.config.format(name=name))
        (folder / "1" / "model.py").write_text(model.source)
    return root
