"""A contender measured over one protocol: the rows of the comparison's tables and plot.

Every contender is measured with batch-1 JSON; those that speak them (zeroserve, its
Python-model form and Triton) also with Triton's binary tensor extension over HTTP/1.1
(the same wrk load, a binary body) and over gRPC (h2load, one framed ModelInferRequest).
A variant's key is its contender's for JSON (so earlier results keep their names) and
``<contender>-<protocol>`` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from bench.comparison.contenders import Contender

PROTOCOLS: Final = ("json", "binary", "grpc")
PROTOCOL_TITLES: Final = {
    "json": "JSON",
    "binary": "binary tensors",
    "grpc": "gRPC",
}


@dataclass(frozen=True)
class Variant:
    """One contender over one protocol."""

    contender: Contender
    protocol: str

    @property
    def key(self) -> str:
        return variant_key(self.contender.key, self.protocol)

    @property
    def title(self) -> str:
        if self.protocol == "json":
            return self.contender.title
        return f"{self.contender.title}, {PROTOCOL_TITLES[self.protocol]}"


def variant_key(contender: str, protocol: str) -> str:
    return contender if protocol == "json" else f"{contender}-{protocol}"


def variants(contenders: Sequence[Contender], protocols: Sequence[str]) -> list[Variant]:
    """Each contender over each of ``protocols`` it speaks, contender by contender."""
    return [
        Variant(contender, protocol)
        for contender in contenders
        for protocol in PROTOCOLS
        if protocol in protocols and protocol in contender.protocols
    ]
