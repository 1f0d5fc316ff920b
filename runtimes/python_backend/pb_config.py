"""The configuration half of ``triton_python_backend_utils``: ``ModelConfig`` for
``auto_complete_config``, the config lookups and the datatype conversions.

Behaviour and error texts are those of Triton's Python backend (r24.10), so that a
model's ``auto_complete_config`` that works there works here, and fails with the same
words where it fails there.
"""

from __future__ import annotations

import json
from typing import Any, Final

import numpy as np

_STRING_TO_NUMPY: Final[dict[str, type]] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# The DataType enum numbers of model_config.proto, in order from TYPE_BOOL (1).
_NUMBERED: Final[tuple[type, ...]] = (
    np.bool_,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.object_,
)


def triton_string_to_numpy(triton_type_string: str) -> type:
    """The numpy type of a config ``data_type`` name (``TYPE_FP32`` -> ``np.float32``)."""
    return _STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type | None:
    """The numpy type of a ``DataType`` enum number; None for numbers without one."""
    if 1 <= data_type <= len(_NUMBERED):
        return _NUMBERED[data_type - 1]
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The ``DataType`` enum number of a numpy type (bytes counts as TYPE_STRING)."""
    if data_type == np.bytes_:
        return len(_NUMBERED)
    for number, numpy_type in enumerate(_NUMBERED, start=1):
        if data_type == numpy_type:
            return number
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``input`` entry of a parsed config named ``name``, or None."""
    return _entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``output`` entry of a parsed config named ``name``, or None."""
    return _entry(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether a parsed config sets ``model_transaction_policy { decoupled: true }``."""
    policy = model_config.get("model_transaction_policy")
    return bool(policy["decoupled"]) if policy is not None else False


def _entry(model_config: dict[str, Any], field: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(field, ()):
        if entry["name"] == name:
            return entry  # type: ignore[no-any-return]
    return None


class ModelConfig:
    """The configuration ``auto_complete_config`` receives and returns.

    Built from the config as JSON text; the model may set ``max_batch_size``, add inputs
    and outputs, turn on dynamic batching and set the transaction policy. What it
    returns becomes the model's configuration (fields the config file set are kept).
    """

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a dict (read it; change it through the methods)."""
        return self._model_config

    @property
    def _name(self) -> str:
        return str(self._model_config["name"])

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``; ValueError if the config already sets a larger one."""
        configured = self._model_config["max_batch_size"]
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher unless another scheduler is configured (ValueError)."""
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        """Add an input, or complete the configured one of that name.

        ValueError for properties other than name, data_type, dims and optional, for a
        missing one, or when the configured input disagrees.
        """
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output, or complete the configured one of that name (see add_input)."""
        self._add("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy``; only ``decoupled``, never changed once set."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" not in transaction_policy_dict:
            return
        wanted = transaction_policy_dict["decoupled"]
        if "decoupled" in policy and policy["decoupled"] != wanted:
            raise ValueError(
                "trying to change decoupled property in auto-complete-config for model "
                f"'{self._name}', which is already set to '{policy['decoupled']}'."
            )
        policy["decoupled"] = wanted

    def _add(self, field: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._name
        listed = "', '".join(allowed[:-1])
        for key in tensor:
            if key not in allowed:
                raise ValueError(
                    f"{field} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{model}' contains property other than '{listed}' and '{allowed[-1]}'."
                )
        if "name" not in tensor:
            raise ValueError(
                f"{field} in auto-complete-config function for model '{model}' is missing "
                "'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{field} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{model}' is missing '{key}' property."
                )
        entries = self._model_config.setdefault(field, [])
        for current in entries:
            if current["name"] != tensor["name"]:
                continue
            _check_same(model, field, current, tensor)
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        entries.append(tensor)


def _check_same(model: str, field: str, current: dict[str, Any], tensor: dict[str, Any]) -> None:
    name = tensor["name"]
    configured_type = current.get("data_type", "TYPE_INVALID")
    if configured_type != "TYPE_INVALID" and configured_type != tensor["data_type"]:
        raise ValueError(
            f"unable to load model '{model}', configuration expects datatype "
            f"{configured_type} for {field} '{name}', model provides {tensor['data_type']}"
        )
    if current.get("dims") and current["dims"] != tensor["dims"]:
        raise ValueError(
            f"model '{model}', tensor '{name}': the model expects dims {tensor['dims']} but "
            f"the model configuration specifies dims {current['dims']}"
        )
    if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
        raise ValueError(
            f"model '{model}', tensor '{name}': the model expects optional "
            f"{tensor['optional']} but the model configuration specifies optional "
            f"{current['optional']}"
        )
