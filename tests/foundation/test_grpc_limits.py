"""`GrpcLimits`' front-end choice: settings only grpc.aio carries out refuse h2corn rather
than be ignored by it."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from foundation.grpc_limits import AIO_ONLY_FIELDS, GrpcLimits


def test_h2corn_is_the_default() -> None:
    assert GrpcLimits().grpc_frontend == "h2corn"


def test_h2corn_takes_the_limits_it_carries_out() -> None:
    limits = GrpcLimits(
        grpc_frontend="h2corn",
        grpc_max_receive_bytes=4096,
        grpc_max_concurrent_rpcs=8,
        grpc_http2_max_concurrent_streams=16,
    )
    assert limits.grpc_http2_max_concurrent_streams == 16


@pytest.mark.parametrize("field", AIO_ONLY_FIELDS)
def test_aio_only_settings_refuse_h2corn(field: str) -> None:
    default = GrpcLimits.model_fields[field].default
    changed: dict[str, Any] = {field: not default if isinstance(default, bool) else default + 1000}
    assert GrpcLimits(grpc_frontend="aio", **changed).grpc_frontend == "aio"
    with pytest.raises(pydantic.ValidationError, match=f"{field} need grpc_frontend 'aio'"):
        GrpcLimits(grpc_frontend="h2corn", **changed)
