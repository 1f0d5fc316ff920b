"""A model version's instances, as its ``instance_group``s place them: one runtime per
device, each running that device's share of the instances.

Triton counts each group's ``count`` once per GPU of a KIND_GPU group (on all GPUs when the
group names none), and once for a KIND_CPU group; several groups add up. A zeroserve
runtime is one engine on one device whose instance count says how many executions it runs
at once, so a version whose groups name one device gets one runtime with the whole count,
and one whose groups name several gets a runtime per device with that device's share.
:class:`Instances` then sends each execution to the runtime with the most instances free,
and the batcher, which runs at most the total count at once, never has to wait for one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from foundation.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup
from runtimes.base import ModelRuntime
from runtimes.capabilities import Capabilities
from runtimes.model_request import ModelRequest, RequestOutcome

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceShare:
    """The instances one device runs: how many, and the config's groups narrowed to it."""

    device: str
    """``cpu`` or ``cuda:N``."""
    count: int
    groups: tuple[ModelInstanceGroup, ...]
    """The groups (or, for a KIND_GPU group over several GPUs, its part) on this device."""


def device_shares(config: ModelConfig) -> list[DeviceShare]:
    """The devices a normalized config's groups place instances on, in the order the groups
    first name them."""
    groups: dict[str, list[ModelInstanceGroup]] = {}
    for group in config.instance_group:
        if group.kind == ModelInstanceGroup.KIND_GPU:
            for gpu in group.gpus:
                narrowed = ModelInstanceGroup()
                narrowed.CopyFrom(group)
                narrowed.gpus[:] = [gpu]
                groups.setdefault(f"cuda:{gpu}", []).append(narrowed)
        else:
            groups.setdefault("cpu", []).append(group)
    return [
        DeviceShare(device, sum(max(g.count, 1) for g in members), tuple(members))
        for device, members in groups.items()
    ]


def config_for(config: ModelConfig, share: DeviceShare, *, is_only: bool) -> ModelConfig:
    """The config a runtime on ``share``'s device loads with: the whole config when it is
    the only device, else one whose groups are that device's (so that the runtime's
    instance count is its share)."""
    device_config = ModelConfig()
    device_config.CopyFrom(config)
    if not is_only:
        del device_config.instance_group[:]
        device_config.instance_group.extend(share.groups)
    return device_config


def has_engine_features(capabilities: Capabilities) -> bool:
    """Whether a runtime offers more than executions (generation, sleep, a watched engine):
    those act on one engine, so such a runtime cannot be spread over several devices."""
    pooled = ("requests", "failure")
    return any(
        getattr(capabilities, f.name) is not None
        for f in dataclasses.fields(capabilities)
        if f.name not in pooled
    )


@dataclass
class _Member:
    runtime: ModelRuntime
    capabilities: Capabilities
    count: int
    busy: int = 0


class Instances:
    """The runtimes of one model version and their share of its instances.

    ``members`` pairs each runtime (loaded) with its capabilities and its instance count;
    the first is the primary, whose capabilities the version offers.
    """

    def __init__(self, members: Sequence[tuple[ModelRuntime, Capabilities, int]]) -> None:
        if not members:
            raise ValueError("a model version needs at least one runtime")
        self._members = [_Member(runtime, caps, count) for runtime, caps, count in members]
        self.count = sum(m.count for m in self._members)
        """Every instance of the version: how many executions may run at once."""

    @property
    def primary(self) -> ModelRuntime:
        return self._members[0].runtime

    @property
    def runtimes(self) -> tuple[ModelRuntime, ...]:
        return tuple(m.runtime for m in self._members)

    @property
    def capabilities(self) -> Capabilities:
        """The primary's capabilities; with several runtimes, per-request executions go
        through :meth:`execute_requests`, which spreads them like :meth:`infer`."""
        primary = self._members[0].capabilities
        if len(self._members) == 1 or primary.requests is None:
            return primary
        return dataclasses.replace(primary, requests=self)

    def member_capabilities(self) -> tuple[Capabilities, ...]:
        """Every runtime's capabilities (each reports its own failures)."""
        return tuple(m.capabilities for m in self._members)

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch on a runtime with an instance free (see :meth:`ModelRuntime.infer`)."""
        if len(self._members) == 1:
            return await self._members[0].runtime.infer(batch)
        member = self._least_busy()
        member.busy += 1
        try:
            return await member.runtime.infer(batch)
        finally:
            member.busy -= 1

    async def execute_requests(self, requests: Sequence[ModelRequest]) -> list[RequestOutcome]:
        """Run one batch of separate requests on a runtime with an instance free."""
        member = self._least_busy() if len(self._members) > 1 else self._members[0]
        executor = member.capabilities.requests
        if executor is None:
            raise TypeError(f"{member.runtime.kind} runtime does not take separate requests")
        member.busy += 1
        try:
            return await executor.execute_requests(requests)
        finally:
            member.busy -= 1

    def _least_busy(self) -> _Member:
        # Busy over count, so that a device with more instances takes more executions; the
        # batcher's bound keeps it below 1 for at least one member.
        return min(self._members, key=lambda m: m.busy / m.count)

    async def unload(self) -> None:
        """Unload every runtime (each once its executions are done); the first error is
        raised after all were tried."""
        failure: BaseException | None = None
        for member in self._members:
            try:
                await member.runtime.unload()
            except BaseException as exc:
                logger.exception("unloading %s on one device failed", member.runtime.name)
                failure = failure or exc
        if failure is not None:
            raise failure
