"""Engine options from a model config's ``parameters`` map, typed and checked.

Triton's ``parameters`` carry strings (``parameters { key: "max_model_len" value {
string_value: "4096" } }``); each LLM engine declares the keys it takes with a type and a
default, and a key it does not know fails the load, so a typo is reported instead of
silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from foundation.proto.model_config_pb2 import ModelConfig

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True)
class Option:
    """One key an engine takes: its type, default (None: the engine decides) and meaning."""

    kind: type[int] | type[float] | type[bool] | type[str]
    default: int | float | bool | str | None
    help: str
    minimum: float | None = None


COMMON: Final[Mapping[str, Option]] = {
    "max_model_len": Option(
        int, None, "context window in tokens; default: the model's own", minimum=1
    ),
    "max_num_seqs": Option(int, 64, "sequences decoded together in one step", minimum=1),
    "max_pending_requests": Option(
        int, 1024, "requests inside the engine at most; more are refused with 503", minimum=1
    ),
    "dtype": Option(str, "auto", "weights dtype: auto, float32, float16 or bfloat16"),
    "token_timeout_s": Option(
        float, 300.0, "longest wait for the next token before the request fails", minimum=0.001
    ),
    "memory_bytes": Option(
        int,
        0,
        "device memory one replica may take (the registration's resources.memory_bytes); "
        "0: not given",
        minimum=0,
    ),
}
"""Keys every LLM engine takes."""

DTYPES: Final = frozenset({"auto", "float32", "float16", "bfloat16"})


class ParameterError(ValueError):
    """A ``parameters`` entry that an engine does not take, or cannot parse."""


def read_parameters(
    config: ModelConfig, options: Mapping[str, Option]
) -> dict[str, int | float | bool | str | None]:
    """Every option in ``options``, from ``config.parameters`` or its default.

    Raises ParameterError naming the key for unknown keys, unparsable values and values
    below an option's minimum.
    """
    values: dict[str, int | float | bool | str | None] = {
        key: option.default for key, option in options.items()
    }
    for key, parameter in config.parameters.items():
        option = options.get(key)
        if option is None:
            raise ParameterError(
                f"unknown parameter {key!r} for backend {config.backend!r}; "
                f"known: {', '.join(sorted(options))}"
            )
        values[key] = _parse(key, parameter.string_value.strip(), option)
    dtype = values.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise ParameterError(f"parameter 'dtype' must be one of {sorted(DTYPES)}, not {dtype!r}")
    return values


def _parse(key: str, raw: str, option: Option) -> int | float | bool | str:
    value: int | float | bool | str
    try:
        if option.kind is bool:
            lowered = raw.lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError(raw)
            value = lowered in _TRUE
        elif option.kind is int:
            value = int(raw)
        elif option.kind is float:
            value = float(raw)
        else:
            value = raw
    except ValueError:
        raise ParameterError(
            f"parameter {key!r} must be a {option.kind.__name__}, not {raw!r}"
        ) from None
    if option.minimum is not None and not isinstance(value, (bool, str)):
        if value < option.minimum:
            raise ParameterError(f"parameter {key!r} must be at least {option.minimum}")
    return value
