"""triton_python_backend_utils as models see it, without a stub: tensors, requests,
responses, errors, the config helpers and ModelConfig for auto-complete."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from runtimes.python_backend import pb_utils


def test_tensor_keeps_name_data_and_reports_triton_dtype():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("INPUT0", data)
    assert tensor.name() == "INPUT0"
    assert tensor.as_numpy() is data
    assert tensor.shape() == [2, 3]
    assert tensor.triton_dtype() == 11  # TYPE_FP32
    assert tensor.is_cpu()


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(np.array([b"a", b"bc"], dtype=np.bytes_), id="bytes"),
        pytest.param(np.array(["a", "bc"]), id="str"),
        pytest.param(np.array([b"a", b"bc"], dtype=np.object_), id="object"),
    ],
)
def test_string_tensors_are_object_arrays(data: np.ndarray):
    tensor = pb_utils.Tensor("TEXT", data)
    assert tensor.as_numpy().dtype == np.object_
    assert tensor.triton_dtype() == 13  # TYPE_STRING


def test_tensor_of_a_dtype_triton_lacks_is_refused():
    with pytest.raises(pb_utils.TritonModelException, match="complex64"):
        pb_utils.Tensor("X", np.zeros(2, dtype=np.complex64))


def test_dlpack_round_trip_without_copy():
    data = np.arange(4, dtype=np.int64)
    tensor = pb_utils.Tensor.from_dlpack("X", pb_utils.Tensor("Y", data))
    assert tensor.name() == "X"
    np.testing.assert_array_equal(tensor.as_numpy(), data)
    assert np.shares_memory(tensor.as_numpy(), data)


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    tensor = pb_utils.Tensor.from_dlpack("X", source)
    np.testing.assert_array_equal(tensor.as_numpy(), source.numpy())
    back = torch.from_dlpack(tensor.to_dlpack())
    assert torch.equal(back, source)
    capsule = torch.utils.dlpack.to_dlpack(source)
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("Z", capsule).as_numpy(), source)


def test_triton_error_codes_and_default():
    error = pb_utils.TritonError("bad input", pb_utils.TritonError.INVALID_ARG)
    assert error.code() == pb_utils.TritonError.INVALID_ARG
    assert error.message() == "bad input"
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    codes = {
        name: int(getattr(pb_utils.TritonError, name))
        for name in (
            "UNKNOWN",
            "INTERNAL",
            "NOT_FOUND",
            "INVALID_ARG",
            "UNAVAILABLE",
            "UNSUPPORTED",
            "ALREADY_EXISTS",
            "CANCELLED",
        )
    }
    assert codes == {
        "UNKNOWN": 0,
        "INTERNAL": 1,
        "NOT_FOUND": 2,
        "INVALID_ARG": 3,
        "UNAVAILABLE": 4,
        "UNSUPPORTED": 5,
        "ALREADY_EXISTS": 6,
        "CANCELLED": 7,
    }


def test_response_with_outputs_or_error():
    out = pb_utils.Tensor("OUT", np.ones(2, dtype=np.float32))
    response = pb_utils.InferenceResponse(output_tensors=[out])
    assert not response.has_error()
    assert response.error() is None
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(response, "MISSING") is None
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("nope"))
    assert failed.has_error()
    assert failed.error().message() == "nope"  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="pb_utils.Tensor"):
        pb_utils.InferenceResponse(output_tensors=[np.ones(2)])  # type: ignore[list-item]


def test_request_accessors():
    x = pb_utils.Tensor("INPUT0", np.ones(1, dtype=np.float32))
    request = pb_utils.InferenceRequest(
        request_id="r1",
        correlation_id="seq",
        inputs=[x],
        requested_output_names=["OUT"],
        model_name="m",
        parameters={"k": 1, "flag": True},
    )
    assert request.request_id() == "r1"
    assert request.correlation_id() == "seq"
    assert request.inputs() == [x]
    assert pb_utils.get_input_tensor_by_name(request, "INPUT0") is x
    assert pb_utils.get_input_tensor_by_name(request, "OTHER") is None
    assert request.requested_output_names() == ["OUT"]
    assert json.loads(request.parameters()) == {"k": 1, "flag": True}
    assert request.is_cancelled() is False
    assert request.get_response_sender() is request.get_response_sender()


def test_a_received_request_is_what_the_constructor_builds():
    x = pb_utils.Tensor("INPUT0", np.ones(1, dtype=np.float32))
    fields: dict[str, Any] = {
        "request_id": "r1",
        "correlation_id": 7,
        "inputs": [x],
        "requested_output_names": ["OUT"],
        "model_name": "m",
        "flags": 1,
        "parameters": '{"k":1}',
    }
    received = pb_utils.InferenceRequest.received(execution=3, index=2, **fields)
    built = pb_utils.InferenceRequest(**fields)
    built._execution, built._index = 3, 2
    assert vars(received) == vars(built)


def test_a_received_tensor_is_what_the_constructor_builds():
    data = np.arange(3, dtype=np.float32)
    received = pb_utils.Tensor.received("T", data, "FP32")
    built = pb_utils.Tensor("T", data)
    assert (received.name(), received.as_numpy(), received.triton_dtype()) == (
        built.name(),
        built.as_numpy(),
        built.triton_dtype(),
    )


def test_request_parameters_are_checked_as_triton_checks_them():
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str"):
        pb_utils.InferenceRequest(
            inputs=[], requested_output_names=[], model_name="m", parameters={"x": 1.5}
        )
    with pytest.raises(pb_utils.TritonModelException, match="integer or string"):
        pb_utils.InferenceRequest(
            correlation_id=1.5,  # type: ignore[arg-type]
            inputs=[],
            requested_output_names=[],
            model_name="m",
        )


def test_outside_a_stub_bls_and_senders_refuse_with_tritons_texts():
    request = pb_utils.InferenceRequest(inputs=[], requested_output_names=[], model_name="m")
    with pytest.raises(pb_utils.TritonModelException, match="only supported during"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException, match="decoupled state"):
        request.get_response_sender().send(pb_utils.InferenceResponse())
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        request.get_response_sender().send(pb_utils.InferenceResponse(), flags=4)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        request.get_response_sender().send()
    with pytest.raises(pb_utils.TritonModelException, match="RESCHEDULE"):
        request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


def test_bytes_serialization_round_trip():
    data = np.array([b"", b"abc", "\u00fc".encode()], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(data)
    assert isinstance(encoded, bytes)
    assert encoded[:4] == b"\x00\x00\x00\x00"
    assert list(pb_utils.deserialize_bytes_tensor(encoded)) == list(data)
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.ones(2)) is None


def test_config_helpers():
    config: dict[str, Any] = {
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32"}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_STRING"}],
        "model_transaction_policy": {"decoupled": True},
    }
    assert pb_utils.get_input_config_by_name(config, "INPUT0") == config["input"][0]
    assert pb_utils.get_input_config_by_name(config, "NOPE") is None
    assert pb_utils.get_output_config_by_name(config, "OUTPUT0") == config["output"][0]
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.numpy_to_triton_type(np.float16) == 10
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    assert not pb_utils.using_decoupled_model_transaction_policy({})


def _config(**fields: object) -> pb_utils.ModelConfig:
    base = {"name": "m", "max_batch_size": 0, "input": [], "output": [], **fields}
    return pb_utils.ModelConfig(json.dumps(base))


def test_model_config_adds_and_completes_tensors():
    config = _config(input=[{"name": "A", "data_type": "TYPE_INVALID", "dims": []}])
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "B", "data_type": "TYPE_INT64", "dims": [-1], "optional": True})
    config.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})
    assert config.as_dict() == {
        "name": "m",
        "max_batch_size": 8,
        "input": [
            {"name": "A", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "B", "data_type": "TYPE_INT64", "dims": [-1], "optional": True},
        ],
        "output": [{"name": "C", "data_type": "TYPE_FP32", "dims": [4]}],
        "dynamic_batching": {},
        "model_transaction_policy": {"decoupled": False},
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            lambda c: c.set_max_batch_size(2),
            "configuration specified max_batch_size 4, but in auto-complete-config function "
            "for model 'm' specified max_batch_size 2",
            id="smaller-batch",
        ),
        pytest.param(
            lambda c: c.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]}),
            "unable to load model 'm', configuration expects datatype TYPE_FP32 for input "
            "'A', model provides TYPE_INT32",
            id="other-dtype",
        ),
        pytest.param(
            lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [5]}),
            "model 'm', tensor 'A': the model expects dims [5] but the model configuration "
            "specifies dims [4]",
            id="other-dims",
        ),
        pytest.param(
            lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32"}),
            "input 'X' in auto-complete-config function for model 'm' is missing 'dims' property.",
            id="no-dims",
        ),
        pytest.param(
            lambda c: c.add_output({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "z": 1}),
            "output 'X' in auto-complete-config function for model 'm' contains property "
            "other than 'name', 'data_type' and 'dims'.",
            id="unknown-property",
        ),
        pytest.param(
            lambda c: c.set_model_transaction_policy({"decoupled": True}),
            "trying to change decoupled property in auto-complete-config for model 'm', "
            "which is already set to 'False'.",
            id="decoupled-changed",
        ),
    ],
)
def test_model_config_refuses_with_tritons_texts(change, message: str):
    config = _config(
        max_batch_size=4,
        input=[{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
        model_transaction_policy={"decoupled": False},
    )
    with pytest.raises(ValueError) as raised:
        change(config)
    assert str(raised.value) == message


def test_dynamic_batching_refused_beside_another_scheduler():
    config = _config(sequence_batching={})
    with pytest.raises(ValueError, match="scheduling_choice as 'sequence_batching'"):
        config.set_dynamic_batching()


def test_logger_outside_a_stub_writes_to_stderr(capsys: pytest.CaptureFixture[str]):
    pb_utils.Logger.log_warn("careful")
    pb_utils.Logger.log("plain", pb_utils.Logger.VERBOSE)
    assert capsys.readouterr().err.splitlines() == ["[WARNING] careful", "[VERBOSE] plain"]
