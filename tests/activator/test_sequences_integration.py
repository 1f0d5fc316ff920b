"""Sequences through the activator to two real data-plane workers (``python -m data_plane``)
serving an ONNX accumulator on implicit state: every request of a sequence reaches the
worker that took its START (another worker would answer that the sequence never started),
sequences spread over both workers, END frees the binding, and a sequence whose worker is
gone gets a clear error while the others go on."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from activator.app import create_app
from activator.lb import Replica, choose_for_key
from activator.settings import ActivatorSettings
from foundation.records import Placement
from tests.activator.conftest import serve_app
from tests.activator.fakes import FakeStore, RecordingActivate
from tests.data_plane.sequence.models import write_onnx_accumulator
from tests.integration.conftest import ServerProcess, start_server

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

WAIT_S = 60.0
WORKERS = ("w1", "w2")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    repo = tmp_path_factory.mktemp("repo")
    write_onnx_accumulator(repo, "acc", max_batch_size=8, idle_us=60_000_000)
    started: dict[str, ServerProcess] = {}
    try:
        for worker_id in WORKERS:
            started[worker_id] = start_server(
                repo,
                tmp_path_factory.mktemp(f"logs-{worker_id}"),
                "--model-control-mode",
                "explicit",
                "--load-model",
                "acc",
            )
        yield started
    finally:
        for server in started.values():
            server.stop()


@contextlib.asynccontextmanager
async def activator(store: FakeStore) -> AsyncIterator[httpx.AsyncClient]:
    settings = ActivatorSettings(startup_sync_timeout_s=10.0, auth="off")
    app = create_app(settings, store, RecordingActivate(), "act-test")
    async with (
        serve_app(app, settings) as url,
        httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client,
    ):
        yield client


async def placed(workers: dict[str, ServerProcess]) -> FakeStore:
    store = FakeStore()
    store.register("acc")
    for worker_id, server in workers.items():
        await store.add_placement(Placement(model="acc", worker_id=worker_id, url=server.url))
    return store


async def step(
    client: httpx.AsyncClient, cid: int | str, value: int, **flags: bool
) -> tuple[int, Any]:
    body = {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
        "parameters": {"sequence_id": cid, **flags},
    }
    response = await client.post("/v2/models/acc/infer", json=body)
    payload = response.json()
    if response.status_code == 200:
        payload = next(o["data"][0] for o in payload["outputs"] if o["name"] == "OUTPUT")
    return response.status_code, payload


def home(cid: int | str) -> str:
    """The worker a sequence's START goes to (the hash every activator computes)."""
    replicas = [Replica(w, f"http://{w}") for w in WORKERS]
    chosen = choose_for_key(replicas, cid)
    assert chosen is not None
    return chosen.worker_id


async def executions(server: ServerProcess) -> int:
    async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
        stats = (await client.get("/v2/models/acc/stats")).json()
    return int(stats["model_stats"][0]["inference_count"])


async def test_each_sequence_sticks_to_the_worker_of_its_start(
    workers: dict[str, ServerProcess],
) -> None:
    ids: list[int | str] = [f"seq-{n}" for n in range(8)]
    assert {home(cid) for cid in ids} == set(WORKERS)  # the ids spread over both
    before = {w: await executions(s) for w, s in workers.items()}
    async with activator(await placed(workers)) as client:
        for cid in ids:
            assert await step(client, cid, 1, sequence_start=True) == (200, 1)
        for k in range(2, 5):
            for cid in ids:
                assert await step(client, cid, 1) == (200, k)
        for cid in ids:
            assert await step(client, cid, 1, sequence_end=True) == (200, 5)
    after = {w: await executions(s) for w, s in workers.items()}
    for worker_id in WORKERS:
        homed = sum(1 for cid in ids if home(cid) == worker_id)
        assert after[worker_id] - before[worker_id] == 5 * homed


async def test_a_sequence_whose_worker_is_gone_gets_a_clear_error(
    workers: dict[str, ServerProcess],
) -> None:
    lost = next(f"lost-{n}" for n in range(100) if home(f"lost-{n}") == "w2")
    kept = next(f"kept-{n}" for n in range(100) if home(f"kept-{n}") == "w1")
    ended = next(f"ended-{n}" for n in range(100) if home(f"ended-{n}") == "w2")
    store = await placed(workers)
    async with activator(store) as client:
        for cid in (lost, kept, ended):
            assert await step(client, cid, 2, sequence_start=True) == (200, 2)
        assert await step(client, ended, 1, sequence_end=True) == (200, 3)
        await store.remove_placement("acc", "w2")
        status, payload = await step(client, lost, 1)
        assert (status, payload) == (
            410,
            {
                "error": f"sequence {lost} of model 'acc' was running on worker w2, which no "
                "longer serves the model: its state is lost; start the sequence again "
                "(sequence_start)"
            },
        )
        # The others are unharmed; the lost one starts again on the worker left.
        assert await step(client, kept, 1, sequence_end=True) == (200, 3)
        assert await step(client, lost, 7, sequence_start=True) == (200, 7)
        assert await step(client, lost, 1, sequence_end=True) == (200, 8)
        # An ended sequence had no binding left: its ID starts afresh anywhere.
        assert await step(client, ended, 4, sequence_start=True, sequence_end=True) == (200, 4)
