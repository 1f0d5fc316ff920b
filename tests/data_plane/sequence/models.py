"""Sequence models for the tests: an ONNX accumulator over implicit state, and Triton-form
and dict-contract Python accumulators that keep their sums by correlation ID.

Every model takes ``INPUT`` (INT32, one element per row) and answers ``OUTPUT``, the sum of
the sequence's inputs so far. The Python ones also answer ``INFO``: a JSON text of what the
model saw of the request (its control tensors, correlation ID and flags), the same for
Triton and zeroserve.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import onnx
from google.protobuf import text_format
from onnx import TensorProto, helper

from foundation.proto import model_config_pb2 as mc
from tests.models import ONNX_IR_VERSION, ONNX_OPSET, write_config

CONTROLS = """
control_input [
  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
  { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
]
"""
"""All four controls, one in each boolean form."""

STATE = """
state [ { input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
          initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]
"""


def sequence_config(
    name: str,
    *,
    backend: str,
    strategy: str = "direct { }",
    max_batch_size: int = 2,
    idle_us: int = 0,
    extra: str = "",
    outputs: tuple[tuple[str, int], ...] = (("OUTPUT", mc.TYPE_INT32),),
    instance_count: int = 1,
) -> mc.ModelConfig:
    """A sequence model's config: ``INPUT`` in, ``outputs`` out, ``strategy`` with the four
    controls (and ``extra`` in ``sequence_batching``)."""
    idle = f"max_sequence_idle_microseconds: {idle_us}" if idle_us else ""
    text = f"""
name: "{name}"
backend: "{backend}"
max_batch_size: {max_batch_size}
sequence_batching {{ {strategy} {idle} {CONTROLS} {extra} }}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {instance_count} kind: KIND_CPU }} ]
"""
    config = text_format.Parse(text, mc.ModelConfig())
    for output_name, datatype in outputs:
        config.output.add(name=output_name, data_type=datatype, dims=[1])
    return config


def write_onnx_accumulator(
    repo: Path,
    name: str,
    *,
    strategy: str = "direct { }",
    max_batch_size: int = 2,
    idle_us: int = 0,
) -> Path:
    """``OUTPUT = ACC + INPUT`` with ``ACC`` implicit state (``ACC_OUT = OUTPUT``), and the
    control tensors echoed (``CORRID_OUT``, ``READY_OUT``)."""
    batch: list[int | str] = ["batch", 1] if max_batch_size else [1]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["ACC", "INPUT"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
            helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
            helper.make_node("Identity", ["READY"], ["READY_OUT"]),
        ],
        "accumulator",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.INT32, batch),
            helper.make_tensor_value_info("ACC", TensorProto.INT32, batch),
            helper.make_tensor_value_info("START", TensorProto.INT32, batch),
            helper.make_tensor_value_info("END", TensorProto.FLOAT, batch),
            helper.make_tensor_value_info("READY", TensorProto.BOOL, batch),
            helper.make_tensor_value_info("CORRID", TensorProto.UINT64, batch),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, batch),
            helper.make_tensor_value_info("ACC_OUT", TensorProto.INT32, batch),
            helper.make_tensor_value_info("CORRID_OUT", TensorProto.UINT64, batch),
            helper.make_tensor_value_info("READY_OUT", TensorProto.BOOL, batch),
        ],
    )
    model_dir = repo / name
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    config = sequence_config(
        name,
        backend="onnxruntime",
        strategy=strategy,
        max_batch_size=max_batch_size,
        idle_us=idle_us,
        extra=STATE,
        outputs=(
            ("OUTPUT", mc.TYPE_INT32),
            ("CORRID_OUT", mc.TYPE_UINT64),
            ("READY_OUT", mc.TYPE_BOOL),
        ),
    )
    write_config(model_dir, config)
    return model_dir


TRITON_ACCUMULATOR = '''\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sums each sequence's INPUT by correlation ID (one instance); INFO tells what it saw."""

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = {}
            for name in ("START", "END", "READY", "CORRID", "ACC"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                seen[name] = None if tensor is None else tensor.as_numpy().tolist()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            key = str(request.correlation_id())
            if request.flags() & 1:
                self.sums[key] = 0
            self.sums[key] = self.sums.get(key, 0) + int(x.sum())
            seen["corr"] = request.correlation_id()
            seen["flags"] = request.flags()
            out = np.array([self.sums[key]], dtype=np.int32).reshape(x.shape)
            info = np.array([json.dumps(seen, sort_keys=True)], dtype=object)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT", out),
                        pb_utils.Tensor("INFO", info.reshape([1] * x.ndim)),
                    ]
                )
            )
        return responses
'''
"""The accumulator in Triton's Python-backend form, the same model.py for Triton and
zeroserve (which runs it in a stub process)."""

DICT_ACCUMULATOR = textwrap.dedent(
    """\
    import numpy as np


    class TritonPythonModel:
        # zeroserve's dict contract: one merged batch in, one out; sums by CORRID.
        def initialize(self, args):
            self.sums = {}

        def execute(self, inputs):
            out = np.zeros_like(inputs["INPUT"])
            for row, corrid in enumerate(inputs["CORRID"].reshape(-1).tolist()):
                if not inputs["READY"].reshape(-1)[row]:
                    continue
                if inputs["START"].reshape(-1)[row]:
                    self.sums[corrid] = 0
                self.sums[corrid] = self.sums.get(corrid, 0) + int(inputs["INPUT"][row].sum())
                out[row] = self.sums[corrid]
            return {"OUTPUT": out}
    """
)
"""The accumulator in zeroserve's dict contract (in process, merged batches)."""


DICT_STATE_ACCUMULATOR = textwrap.dedent(
    """\
    class TritonPythonModel:
        # zeroserve's dict contract on implicit state: the batcher keeps ACC.
        def execute(self, inputs):
            total = inputs["ACC"] + inputs["INPUT"]
            return {"OUTPUT": total, "ACC_OUT": total}
    """
)
"""The accumulator in the dict contract, its sum kept as implicit state (``STATE``)."""


def write_python_accumulator(
    repo: Path,
    name: str,
    *,
    source: str = TRITON_ACCUMULATOR,
    strategy: str = "direct { }",
    max_batch_size: int = 2,
    idle_us: int = 0,
    with_info: bool = True,
    extra: str = "",
) -> Path:
    """A Python accumulator (``source``) with the four controls (and ``extra`` in its
    ``sequence_batching``)."""
    outputs: tuple[tuple[str, int], ...] = (("OUTPUT", mc.TYPE_INT32),)
    if with_info:
        outputs += (("INFO", mc.TYPE_STRING),)
    config = sequence_config(
        name,
        backend="python",
        strategy=strategy,
        max_batch_size=max_batch_size,
        idle_us=idle_us,
        extra=extra,
        outputs=outputs,
    )
    model_dir = repo / name
    write_config(model_dir, config)
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(source)
    return model_dir
