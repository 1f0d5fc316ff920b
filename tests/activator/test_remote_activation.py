"""An activator apart from the acting control plane: its activation request through the
store, and the watch on the model's record that answers a failure for good at once."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from activator.remote_activation import StoreActivate
from foundation.errors import ModelFailedError
from foundation.records import ModelFailure, Placement
from tests.activator.fakes import FakeStore

pytestmark = pytest.mark.anyio

POLL_S = 0.01


class _Store(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.requested: list[str] = []
        self.looked = asyncio.Event()
        """Set at the second look at the record (the watch is running)."""

    async def request_activation(self, model: str) -> None:
        self.requested.append(model)

    async def get_model(self, name: str):
        record = await super().get_model(name)
        if len(self.get_model_calls) >= 2:
            self.looked.set()
        return record


async def test_a_failure_recorded_while_waiting_is_raised_with_its_reason():
    store = _Store()
    store.register("m")
    call = asyncio.create_task(StoreActivate(store, poll_s=POLL_S, give_up_s=60.0)("m"))
    await asyncio.wait_for(store.looked.wait(), 30.0)
    assert not call.done()
    store.models["m"] = dataclasses.replace(
        store.models["m"], failure=ModelFailure(reason="bad config", failed_at=5.0)
    )
    with pytest.raises(ModelFailedError) as raised:
        await asyncio.wait_for(call, 30.0)
    assert (raised.value.model, raised.value.reason, raised.value.failed_at) == (
        "m",
        "bad config",
        5.0,
    )
    assert store.requested == ["m"]


async def test_a_placement_ends_the_watch():
    store = _Store()
    store.register("m")
    call = asyncio.create_task(StoreActivate(store, poll_s=POLL_S, give_up_s=60.0)("m"))
    await store.add_placement(Placement(model="m", worker_id="w1", url="http://w1"))
    await asyncio.wait_for(call, 30.0)  # returns, well before give_up_s
    assert store.requested == ["m"]


async def test_a_store_failing_a_look_is_asked_again_and_the_watch_gives_up_in_time():
    store = _Store()
    store.register("m")
    store.get_model_error = ConnectionError("store down")
    await asyncio.wait_for(StoreActivate(store, poll_s=POLL_S, give_up_s=0.1)("m"), 30.0)
    assert len(store.get_model_calls) >= 2
    assert store.requested == ["m"]


async def test_a_deleted_model_ends_the_watch():
    store = _Store()
    watch = StoreActivate(store, poll_s=POLL_S, give_up_s=60.0)
    await asyncio.wait_for(watch("m"), 30.0)  # returns, well before give_up_s
    assert store.get_model_calls == ["m"]
