"""``zeroserve models register``: the registration body its arguments make."""

from __future__ import annotations

import pytest

from zeroserve.cli import build_parser, registration_body


def body_of(*argv: str) -> dict[str, object]:
    return registration_body(build_parser().parse_args(["models", "register", *argv]))


def test_bls_models_are_listed_in_the_order_given():
    body = body_of("bls", "--storage-uri", "/m/bls", "--bls-model", "add_sub", "--bls-model", "pre")
    assert body == {"name": "bls", "storage_uri": "/m/bls", "bls_models": ["add_sub", "pre"]}


def test_every_option_reaches_its_field():
    body = body_of(
        "m",
        "--storage-uri",
        "s3://b/m",
        "--backend",
        "python",
        "--config",
        '{"max_batch_size": 8}',
        "--min-replicas",
        "0",
        "--idle-timeout-s",
        "60",
        "--device",
        "cuda",
        "--memory-bytes",
        "1024",
    )
    assert body == {
        "name": "m",
        "storage_uri": "s3://b/m",
        "backend": "python",
        "config": {"max_batch_size": 8},
        "scaling": {"min_replicas": 0, "idle_timeout_s": 60.0},
        "resources": {"device": "cuda", "memory_bytes": 1024},
    }


def test_a_config_that_is_not_json_is_refused():
    with pytest.raises(ValueError, match="--config is not JSON"):
        body_of("m", "--storage-uri", "/m", "--config", "{nope")
