"""API keys at the activator, in process: the key cache (lookups, revocations, outages) and
the HTTP refusals (401, 403, 429, OpenAI's shape on /v1), before anything wakes a model."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from activator.app import create_app
from activator.errors import ForbiddenModelError, KeyLookupUnavailableError, UnauthenticatedError
from activator.keys import KeyRing
from activator.settings import ActivatorSettings
from foundation.keys import ApiKeyRecord, KeyLimits, new_key
from tests.activator.conftest import asgi_client
from tests.activator.fakes import FakeStore, RecordingActivate, settle
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


def make_key(
    store: FakeStore, *, models: tuple[str, ...] = ("*",), **limits: float
) -> tuple[str, ApiKeyRecord]:
    made = new_key()
    record = ApiKeyRecord(
        id=made.key_id,
        name="t",
        secret_sha256=made.secret_sha256,
        models=models,
        limits=KeyLimits(**limits),  # type: ignore[arg-type]
    )
    store.keys[record.id] = record
    return made.token, record


def ring(store: FakeStore, clock: FakeClock | None = None, wall: float = 1e9) -> KeyRing:
    return KeyRing(
        store,
        ttl_s=30.0,
        max_entries=3,
        retry_after_s=1,
        resubscribe_delay_s=0.01,
        wall=lambda: wall,
        clock=clock or FakeClock(),
    )


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(None, id="missing"),
        pytest.param("", id="empty"),
        pytest.param("Basic abc", id="not-bearer"),
        pytest.param("Bearer", id="no-token"),
        pytest.param("Bearer zs_abc", id="malformed"),
        pytest.param("Bearer zs_0123456789ab_" + "a" * 43, id="unknown"),
    ],
)
async def test_bad_headers_are_unauthenticated(header: str | None):
    with pytest.raises(UnauthenticatedError):
        await ring(FakeStore()).authenticate(header)


async def test_a_wrong_secret_an_expired_and_a_revoked_key_read_alike():
    store = FakeStore()
    token, record = make_key(store)
    keys = ring(store)
    assert await keys.authenticate(f"Bearer {token}") == record
    assert await keys.authenticate(f"bearer {token}") == record
    messages = set()
    for case in ("secret", "expired", "revoked"):
        store.keys[record.id] = record
        attempt = token
        if case == "secret":
            attempt = token[:-2] + ("xx" if not token.endswith("xx") else "yy")
        elif case == "expired":
            store.keys[record.id] = dataclasses.replace(record, expires_at=1.0)
        else:
            store.keys[record.id] = dataclasses.replace(record, revoked_at=5.0)
        fresh = ring(store)
        with pytest.raises(UnauthenticatedError) as refused:
            await fresh.authenticate(f"Bearer {attempt}")
        messages.add(refused.value.message)
        assert token not in refused.value.message
    assert len(messages) == 1


async def test_lookups_are_cached_and_deduplicated_and_unknown_ids_too():
    store = FakeStore()
    token, _ = make_key(store)
    clock = FakeClock()
    keys = ring(store, clock)
    await asyncio.gather(*(keys.authenticate(f"Bearer {token}") for _ in range(5)))
    assert len(store.get_key_calls) == 1
    unknown = "Bearer zs_0123456789ab_" + "a" * 43
    for _ in range(3):
        with pytest.raises(UnauthenticatedError):
            await keys.authenticate(unknown)
    assert len(store.get_key_calls) == 2
    clock.advance(31.0)
    await keys.authenticate(f"Bearer {token}")
    assert len(store.get_key_calls) == 3


async def test_a_revocation_event_evicts_at_once_and_ends_streams():
    store = FakeStore()
    token, record = make_key(store)
    keys = ring(store)
    follower = asyncio.create_task(keys.run())
    try:
        await settle()
        assert await keys.authenticate(f"Bearer {token}") == record
        assert keys.still_valid(record)
        store.revoke(record.id, revoked_at=7.0)
        await settle()
        assert not keys.still_valid(record)
        with pytest.raises(UnauthenticatedError):
            await keys.authenticate(f"Bearer {token}")
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def test_a_store_outage_is_503_for_uncached_keys_only():
    store = FakeStore()
    cached, _ = make_key(store)
    other, _ = make_key(store)
    keys = ring(store)
    await keys.authenticate(f"Bearer {cached}")

    async def fail(key_id: str) -> ApiKeyRecord | None:
        raise ConnectionError("store down")

    store.get_key = fail  # type: ignore[method-assign]
    await keys.authenticate(f"Bearer {cached}")
    with pytest.raises(KeyLookupUnavailableError) as unavailable:
        await keys.authenticate(f"Bearer {other}")
    assert unavailable.value.retry_after_s == 1


def test_scope_patterns():
    record = ApiKeyRecord(id="x", name="t", secret_sha256="", models=("mlp", "resnet-*"))
    KeyRing.authorize(record, "mlp")
    KeyRing.authorize(record, "resnet-50")
    for model in ("mlp2", "resnet", "bert"):
        with pytest.raises(ForbiddenModelError):
            KeyRing.authorize(record, model)


def _settings() -> ActivatorSettings:
    return ActivatorSettings(startup_sync_timeout_s=5.0)


async def test_http_refusals_come_before_the_model_is_looked_up_or_woken():
    store = FakeStore()
    store.register("mlp")
    token, _ = make_key(store, models=("mlp",))
    limited, _ = make_key(store, requests_per_s=0.001, burst=1)
    activate = RecordingActivate()
    app = create_app(_settings(), store, activate, "act-1")
    async with asgi_client(app) as client:
        for path in ("/v2/health/live", "/v2/health/ready", "/v2", "/metrics"):
            assert (await client.get(path)).status_code == 200, path
        anonymous = await client.post("/v2/models/mlp/infer", content=b"{}")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert anonymous.json() == {"error": "missing API key: send 'Authorization: Bearer <key>'"}
        headers = {"Authorization": f"Bearer {token}"}
        known = await client.post("/v2/models/other/infer", content=b"{}", headers=headers)
        unknown = await client.post("/v2/models/ghost/infer", content=b"{}", headers=headers)
        assert known.status_code == unknown.status_code == 403
        assert known.json()["error"].replace("other", "ghost") == unknown.json()["error"]
        assert (await client.get("/v2/models/mlp/ready", headers=headers)).status_code == 200
        openai = await client.post(
            "/v1/chat/completions", json={"model": "ghost"}, headers={"Authorization": "x"}
        )
        assert openai.status_code == 401
        assert openai.json()["error"]["code"] == "invalid_api_key"
        models = await client.get("/v1/models", headers=headers)
        assert [m["id"] for m in models.json()["data"]] == ["mlp"]
        over = {"Authorization": f"Bearer {limited}"}
        assert (await client.get("/v2/models/mlp/ready", headers=over)).status_code == 200
        refused = await client.post("/v1/completions", json={"model": "mlp"}, headers=over)
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) > 60
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert activate.calls == []
    assert store.get_model_calls == ["mlp"]


@pytest.mark.parametrize(
    ("host", "auth", "warned"),
    [
        pytest.param("0.0.0.0", "off", True, id="off-beyond-loopback"),
        pytest.param("10.1.2.3", "off", True, id="off-on-an-address"),
        pytest.param("127.0.0.1", "off", False, id="off-on-loopback"),
        pytest.param("::1", "off", False, id="off-on-ipv6-loopback"),
        pytest.param("0.0.0.0", "keys", False, id="keys"),
    ],
)
def test_keys_off_beyond_loopback_is_a_loud_warning(
    host: str, auth: str, warned: bool, caplog: pytest.LogCaptureFixture
):
    settings = ActivatorSettings(host=host, auth=auth)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="activator.core"):
        create_app(settings, FakeStore(), RecordingActivate(), "act-1")
    found = [r for r in caplog.records if "API keys are OFF" in r.getMessage()]
    assert bool(found) == warned
