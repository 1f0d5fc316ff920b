"""Cluster mode end to end: each component its own process, all sharing one real Redis.

One redis-server (with an append-only file, so a restart keeps the registry, as a managed
Redis does), two ``zeroserve control-plane`` and two ``zeroserve activator`` processes, each
on free loopback ports. The activators reach the control plane only through the store: they
ask for activations there (``request_activation``), the acting control plane consumes the
requests (``subscribe_activation_requests``), and the activators report each cold start's
first response the same way. Nothing here asserts a duration: every wait polls with a
generous deadline, and every process is stopped (and the workers checked gone) even when the
test fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.control_plane.store.conftest import RedisServer, start_redis_server
from tests.integration.conftest import free_port
from tests.integration.test_platform_e2e import (
    AUTH,
    SIZES,
    TOKEN,
    assert_clear_error,
    assert_mlp_answer,
    descendants_of,
    infer_body,
    is_alive,
    mlp_input,
)
from tests.models import write_onnx_mlp

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

WAIT_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
LEASE_TTL_S = 3.0
REQUESTS_PER_ACTIVATOR = 6


# ---- processes ----


@dataclass
class Component:
    """One running ``zeroserve control-plane`` or ``zeroserve activator``."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    """The admin API of a control plane; the public endpoint of an activator."""
    ready_path: str
    log_path: Path
    worker_pids: set[int] = field(default_factory=set)
    is_stopped: bool = False
    """Stopped on purpose: its exit is no failure."""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def remember_workers(self) -> None:
        """Note the worker processes (descendants) now, for the check that none outlives us."""
        if self.process.poll() is None:
            self.worker_pids |= descendants_of(self.process.pid)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.remember_workers()
        self.is_stopped = True
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)


class Cluster:
    """Starts the components against one Redis; :meth:`close` stops them all."""

    def __init__(self, tmp_path: Path, redis: RedisServer) -> None:
        self.tmp_path = tmp_path
        self.redis = redis
        self.models_dir = tmp_path / "models"
        self.models_dir.mkdir()
        self.components: list[Component] = []

    def start_control_plane(self, name: str) -> Component:
        port = free_port()
        return self._start(
            name,
            [
                "control-plane",
                "--state",
                self.redis.url,
                "--admin-port",
                str(port),
                "--cache-dir",
                str(self.tmp_path / f"{name}-cache"),
                "--worker-log-dir",
                str(self.tmp_path / f"{name}-workers"),
                "--max-workers",
                "2",
            ],
            f"http://127.0.0.1:{port}",
            "/healthz",
            ZEROSERVE_ADMIN_TOKEN=TOKEN,
            ZEROSERVE_ALLOWED_STORAGE=str(self.models_dir),
            ZEROSERVE_CONTROL_PLANE_LEASE_TTL_S=str(LEASE_TTL_S),
            ZEROSERVE_CONTROL_PLANE_REAPER_INTERVAL_S="0.2",
            ZEROSERVE_CONTROL_PLANE_WORKER_HEALTH_INTERVAL_S="0.5",
            ZEROSERVE_CONTROL_PLANE_PLACEMENT_PROPAGATION_S="0.3",
        )

    def start_activator(self, name: str, **env: str) -> Component:
        """An activator on the cluster's Redis; keys off unless ``env`` says otherwise."""
        port = free_port()
        return self._start(
            name,
            ["activator", "--state", self.redis.url, "--host", "127.0.0.1", "--port", str(port)],
            f"http://127.0.0.1:{port}",
            "/v2/health/ready",
            ZEROSERVE_ACTIVATOR_TRAFFIC_REPORT_INTERVAL_S="0.2",
            # A request that finds no replica gives up (503) before the test's client does.
            ZEROSERVE_ACTIVATOR_ACTIVATION_TIMEOUT_S="60",
            **{"ZEROSERVE_ACTIVATOR_AUTH": "off", **env},
        )

    def _start(
        self, name: str, args: list[str], url: str, ready_path: str, **env: str
    ) -> Component:
        log_path = self.tmp_path / f"{name}.log"
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **env}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "zeroserve.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
            )
        component = Component(name, process, url, ready_path, log_path)
        self.components.append(component)
        return component

    def logs(self) -> str:
        tails = [f"--- {c.name}:\n{c.log()[-4000:]}" for c in self.components]
        return "\n".join(tails) + f"\n--- redis:\n{self.redis.log()[-2000:]}"

    def close(self) -> set[int]:
        """Stop every component; the worker pids still alive after a grace (then killed)."""
        for component in self.components:
            component.stop()
        alive = {p for c in self.components for p in c.worker_pids if is_alive(p)}
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = {p for p in alive if is_alive(p)}
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        return alive


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = start_redis_server(tmp_path, persistent=True)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(tmp_path: Path, redis: RedisServer) -> Iterator[Cluster]:
    """Stopped before Redis (fixtures end in reverse), so nothing sees Redis go first."""
    cluster = Cluster(tmp_path, redis)
    try:
        yield cluster
    finally:
        orphans = cluster.close()
        assert not orphans, f"workers outlived their control plane: {orphans}"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:
        yield http


# ---- helpers ----


async def eventually(check: Callable[[], Awaitable[bool]], what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while time.monotonic() < deadline:
        for component in cluster.components:
            if component.process.poll() is not None and not component.is_stopped:
                raise AssertionError(f"{component.name} exited:\n{cluster.logs()}")
        try:
            if await check():
                return
        except httpx.TransportError:
            pass  # not listening yet, or Redis is restarting under it
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}:\n{cluster.logs()}")


async def wait_started(client: httpx.AsyncClient, cluster: Cluster, *started: Component) -> None:
    async def all_ready() -> bool:
        for component in started:
            response = await client.get(component.url + component.ready_path, timeout=2.0)
            if response.status_code != 200:
                return False
        return True

    names = ", ".join(c.name for c in started)
    await eventually(all_ready, f"{names} to start", cluster)


async def is_acting(client: httpx.AsyncClient, control_plane: Component) -> bool:
    response = await client.get(f"{control_plane.url}/healthz", timeout=2.0)
    return response.status_code == 200 and bool(response.json()["acting"])


async def admin_get(client: httpx.AsyncClient, control_plane: Component, path: str) -> Any:
    response = await client.get(f"{control_plane.url}/admin/v1{path}", headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


async def register(
    client: httpx.AsyncClient, control_plane: Component, cluster: Cluster, name: str, seed: int
) -> Path:
    model_dir = write_onnx_mlp(cluster.models_dir, name, SIZES, seed=seed)
    body = {
        "name": name,
        "storage_uri": str(model_dir),
        "scaling": {"min_replicas": 0, "idle_timeout_s": 600},
    }
    response = await client.post(f"{control_plane.url}/admin/v1/models", json=body, headers=AUTH)
    assert response.status_code == 201, response.text
    return model_dir


async def burst(
    client: httpx.AsyncClient, activators: list[Component], model_dir: Path, seed: int
) -> None:
    """Concurrent requests through every activator; each must be answered correctly."""
    inputs = [
        (activator, mlp_input(seed * 100 + i))
        for activator in activators
        for i in range(REQUESTS_PER_ACTIVATOR)
    ]
    responses = await asyncio.gather(
        *(
            client.post(f"{a.url}/v2/models/{model_dir.name}/infer", json=infer_body(x))
            for a, x in inputs
        )
    )
    for (_, x), response in zip(inputs, responses, strict=True):
        assert_mlp_answer(response, model_dir, x)


async def answered_everywhere(
    client: httpx.AsyncClient, cluster: Cluster, activators: list[Component], model_dir: Path
) -> None:
    """Wait until every activator answers a request for the model (a clear 5xx meanwhile)."""
    x = mlp_input(7)
    for activator in activators:

        async def answers(activator: Component = activator) -> bool:
            url = f"{activator.url}/v2/models/{model_dir.name}/infer"
            response = await client.post(url, json=infer_body(x))
            if response.status_code != 200:
                assert_clear_error(response)
                return False
            assert_mlp_answer(response, model_dir, x)
            return True

        await eventually(answers, f"{activator.name} to answer for {model_dir.name}", cluster)


async def closed_timeline(
    client: httpx.AsyncClient, control_plane: Component, cluster: Cluster, model: str
) -> dict[str, Any]:
    """The model's newest timeline once an activator's first response has closed it."""
    latest: dict[str, Any] = {}

    async def closed() -> bool:
        nonlocal latest
        timelines = (await admin_get(client, control_plane, f"/models/{model}/activations"))[
            "activations"
        ]
        latest = timelines[0] if timelines else {}
        return "first_response" in latest.get("durations_s", {})

    await eventually(closed, f"the first response of {model} in its timeline", cluster)
    return latest


def assert_cold_start_through_the_store(timeline: dict[str, Any]) -> None:
    assert timeline["trigger"] == "request"  # asked for by an activator, through the store
    assert timeline["outcome"] == "ready"
    phases = [p["phase"] for p in timeline["phases"]]
    assert phases[0] == "queued"
    assert phases[-3:] == ["engine_built", "ready", "first_response"]
    times = [p["at_s"] for p in timeline["phases"]]
    assert times == sorted(times)
    assert timeline["durations_s"]["first_response"] >= timeline["durations_s"]["total"]


async def first_response_count(
    client: httpx.AsyncClient, control_plane: Component, cache: str
) -> float:
    text = (await client.get(f"{control_plane.url}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "zeroserve_activation_duration_seconds_count" and sample.labels == {
                "phase": "first_response",
                "cache": cache,
            }:
                return sample.value
    return 0.0


# ---- the test ----


async def test_two_control_planes_and_two_activators_on_one_redis(
    cluster: Cluster, client: httpx.AsyncClient
):
    first = cluster.start_control_plane("cp-1")
    await wait_started(client, cluster, first)
    await eventually(lambda: is_acting(client, first), "cp-1 to take the lease", cluster)
    second = cluster.start_control_plane("cp-2")
    activators = [cluster.start_activator("act-1"), cluster.start_activator("act-2")]
    await wait_started(client, cluster, second, *activators)
    assert not await is_acting(client, second)

    # Registered through the replica that does not act: the registry is the store. The
    # burst through both activators cold-starts it once, asked for through the store.
    cold = await register(client, second, cluster, "cold", seed=1)
    await burst(client, activators, cold, seed=1)
    timeline = await closed_timeline(client, second, cluster, "cold")
    assert_cold_start_through_the_store(timeline)
    assert len((await admin_get(client, first, "/models/cold/activations"))["activations"]) == 1
    assert await first_response_count(client, first, timeline["cache"]) == 1.0
    first.remember_workers()
    assert first.worker_pids, "cp-1 (acting) should run the model's worker"

    # kill -9 the acting control plane (its workers die with it): the other takes over,
    # drops the dead worker's placement, and cold-starts on request again.
    first.stop(signal.SIGKILL)
    await eventually(lambda: is_acting(client, second), "cp-2 to take the lease", cluster)

    async def dead_placement_gone() -> bool:
        status = (await admin_get(client, second, "/models/cold"))["status"]
        return not status["replicas"]

    await eventually(dead_placement_gone, "cp-2 to remove the dead worker", cluster)
    await burst(client, activators, cold, seed=2)
    fresh = await register(client, second, cluster, "after-failover", seed=3)
    await burst(client, activators, fresh, seed=3)
    for name in ("cold", "after-failover"):
        timeline = await closed_timeline(client, second, cluster, name)
        assert_cold_start_through_the_store(timeline)
    assert await first_response_count(client, second, timeline["cache"]) >= 1.0
    second.remember_workers()

    # Redis restarts (keeping its data): the activators and the control plane reconnect,
    # placed models are answered, and a new cold start goes through the store again.
    cluster.redis.restart()
    await eventually(lambda: is_acting(client, second), "cp-2 to act after the restart", cluster)
    await answered_everywhere(client, cluster, activators, cold)
    await answered_everywhere(client, cluster, activators, fresh)

    async def registry_back() -> bool:
        models = (await admin_get(client, second, "/models"))["models"]
        return sorted(m["name"] for m in models) == ["after-failover", "cold"]

    await eventually(registry_back, "the registry after the restart", cluster)
    late = await register(client, second, cluster, "after-restart", seed=4)
    await burst(client, activators, late, seed=4)
    assert_cold_start_through_the_store(
        await closed_timeline(client, second, cluster, "after-restart")
    )
    second.remember_workers()
    assert await is_acting(client, second)


async def test_keys_and_quotas_hold_across_two_activators_on_one_redis(
    cluster: Cluster, client: httpx.AsyncClient
):
    """A key made through the admin API works on both activators, one rate budget is
    shared by both, and a revocation reaches both. Readiness of an unregistered model is
    enough to see it (404 once let in): no worker is needed."""
    control_plane = cluster.start_control_plane("cp")
    activators = [
        cluster.start_activator(f"act-{i}", ZEROSERVE_ACTIVATOR_AUTH="keys") for i in (1, 2)
    ]
    await wait_started(client, cluster, control_plane, *activators)

    async def create(**body: Any) -> str:
        response = await client.post(
            f"{control_plane.url}/admin/v1/keys", json={"name": "k", **body}, headers=AUTH
        )
        assert response.status_code == 201, response.text
        return str(response.json()["key"])

    async def statuses(token: str, count: int) -> list[int]:
        answers = []
        for i in range(count):
            response = await client.get(
                f"{activators[i % 2].url}/v2/models/nowhere/ready",
                headers={"Authorization": f"Bearer {token}"},
            )
            answers.append(response.status_code)
        return answers

    full = await create()
    assert await statuses(full, 2) == [404, 404]
    # Four requests at once, then one per ~17 minutes, for both activators together.
    limited = await create(limits={"requests_per_s": 0.001, "burst": 4})
    assert await statuses(limited, 10) == [404] * 4 + [429] * 6

    key_id = full.split("_")[1]
    response = await client.post(f"{control_plane.url}/admin/v1/keys/{key_id}/revoke", headers=AUTH)
    assert response.status_code == 200

    async def refused_everywhere() -> bool:
        return await statuses(full, 2) == [401, 401]

    await eventually(refused_everywhere, "both activators to refuse the revoked key", cluster)
    for component in cluster.components:
        assert full.rsplit("_", 1)[1] not in component.log()
