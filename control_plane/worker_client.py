"""Talking to a worker's data plane: Triton's repository load and unload, zeroserve's sleep
and wake (LLM engines), and the worker's counters.

A load is ``POST /v2/repository/models/{name}/load`` with ``storage_uri`` (and ``config``,
a Triton ModelConfig JSON string, when the registration carries one; its ``parameters``
then carry the registration's ``memory_bytes``). The worker's answer
says where the model's files came from for that load alone (``hit``, ``miss`` or ``local``),
the bytes it downloaded and how long getting them took; a worker that answers without it
(Triton itself) leaves the report's cache ``unknown``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import httpx

from control_plane.errors import LoadFailedError, WorkerCallError
from foundation.records import ModelRecord, WorkerRecord

__all__ = [
    "LoadReport",
    "WorkerClient",
    "is_permanent_refusal",
    "load_body",
    "probe_live",
    "probe_round",
]

logger = logging.getLogger(__name__)

_CACHE_OUTCOMES = frozenset({"hit", "miss", "local"})
_PROGRESS_TIMEOUT_S = 2.0
"""A progress answer later than this is skipped: the next poll asks again."""
_VERSIONS_TIMEOUT_S = 2.0
"""A model's versions answered later than this are given as unknown: a page that shows
them must not wait on a busy or stuck worker."""


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What one load on a worker took."""

    duration_s: float
    """From the load call to the worker's answer."""
    cache: str = "unknown"
    """``hit`` (the node cache held the model), ``miss`` (downloaded), ``local`` (a local
    folder, no cache involved) or ``unknown`` (the worker did not say)."""
    bytes_fetched: int | None = None
    """Bytes downloaded into the node cache for this load; None when unknown."""
    fetch_s: float | None = None
    """Time the worker spent getting the files (listing, checking, downloading); None when
    unknown."""


def load_body(model: ModelRecord, *, allow_model_code: bool = True) -> dict[str, Any]:
    """The repository-API load request for ``model``; ``allow_model_code`` False asks the
    worker to refuse a model that is code, whatever its files say."""
    parameters: dict[str, Any] = {"storage_uri": model.storage_uri}
    if not allow_model_code:
        parameters["allow_model_code"] = False
    if model.config is not None:
        config = dict(model.config)
        config.setdefault("name", model.name)
        if model.backend and not config.get("backend"):
            config["backend"] = model.backend
        if model.platform and not config.get("platform"):
            config["platform"] = model.platform
        given = config.get("parameters") or {}
        if model.resources.memory_bytes and "memory_bytes" not in given:
            # The runtimes size themselves by it: vLLM's share of the GPU, ONNX Runtime's
            # CUDA arena.
            memory = {"string_value": str(model.resources.memory_bytes)}
            config["parameters"] = {**given, "memory_bytes": memory}
        parameters["config"] = json.dumps(config)
    return {"parameters": parameters}


async def probe_live(http: httpx.AsyncClient, url: str) -> bool:
    """One liveness probe (``/v2/health/live``) of the worker at ``url`` through ``http``:
    True on 200, False on any other answer or a transport failure."""
    try:
        response = await http.get(f"{url}/v2/health/live")
    except httpx.HTTPError:
        return False
    return response.status_code == 200


class Probed(Protocol):
    """A backend's worker as :func:`probe_round` sees it."""

    record: WorkerRecord
    failures: int
    """Liveness probes failed in a row."""
    is_stopping: bool


_W = TypeVar("_W", bound=Probed)


async def probe_round(
    workers: Iterable[_W], health: Callable[[str], Awaitable[bool]], threshold: int
) -> list[_W]:
    """Probe every worker not stopping at once (``health`` takes a worker id), count each
    one's failures in a row, and return those that reached ``threshold``."""
    probed = [w for w in workers if not w.is_stopping]
    results = await asyncio.gather(*(health(w.record.id) for w in probed))
    failing = []
    for worker, is_live in zip(probed, results, strict=True):
        if is_live:
            worker.failures = 0
            continue
        worker.failures += 1
        if worker.failures >= threshold:
            failing.append(worker)
    return failing


class WorkerClient:
    """HTTP calls from the control plane to workers; owns one ``httpx.AsyncClient``."""

    def __init__(
        self,
        *,
        load_timeout_s: float,
        unload_timeout_s: float,
        allow_model_code: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._allow_model_code = allow_model_code
        self._load_timeout = httpx.Timeout(5.0, read=load_timeout_s)
        self._unload_timeout = httpx.Timeout(5.0, read=unload_timeout_s)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            # Worker traffic stays on the node or in the cluster: no proxies from the env.
            trust_env=False,
            transport=transport,
        )

    async def load(self, worker: WorkerRecord, model: ModelRecord) -> LoadReport:
        """Load ``model`` on ``worker``; raises ``LoadFailedError`` or ``WorkerCallError``."""
        started = time.monotonic()
        try:
            response = await self._http.post(
                f"{worker.url}/v2/repository/models/{_segment(model.name)}/load",
                json=load_body(model, allow_model_code=self._allow_model_code),
                timeout=self._load_timeout,
            )
        except httpx.HTTPError as exc:
            raise WorkerCallError(worker=worker.id, reason=f"load call failed: {exc!r}") from exc
        duration_s = time.monotonic() - started
        if response.status_code != 200:
            raise LoadFailedError(
                model=model.name,
                worker=worker.id,
                reason=_reason(response),
                is_permanent=is_permanent_refusal(response.status_code),
                worker_message=_error_text(response),
            )
        return _report(duration_s, response)

    async def unload(self, worker: WorkerRecord, model: str) -> None:
        """Unload ``model`` from ``worker``; the worker drains what it accepted first."""
        try:
            response = await self._http.post(
                f"{worker.url}/v2/repository/models/{_segment(model)}/unload",
                json={},
                timeout=self._unload_timeout,
            )
        except httpx.HTTPError as exc:
            raise WorkerCallError(worker=worker.id, reason=f"unload call failed: {exc!r}") from exc
        if response.status_code != 200:
            raise WorkerCallError(
                worker=worker.id, reason=f"unload of '{model}' failed: {_reason(response)}"
            )

    async def sleep(self, worker: WorkerRecord, model: str) -> None:
        """Put ``model`` to sleep on ``worker`` (``POST .../sleep``); it drains first.

        Raises ``LoadFailedError`` when the worker refuses (a runtime that cannot sleep,
        nothing loaded) and ``WorkerCallError`` when it cannot be reached.
        """
        await self._repository_call(worker, model, "sleep", self._unload_timeout)

    async def wake(self, worker: WorkerRecord, model: str) -> None:
        """Wake ``model`` on ``worker`` (``POST .../wake``); same errors as :meth:`sleep`."""
        await self._repository_call(worker, model, "wake", self._load_timeout)

    async def _repository_call(
        self, worker: WorkerRecord, model: str, action: str, timeouts: httpx.Timeout
    ) -> None:
        try:
            response = await self._http.post(
                f"{worker.url}/v2/repository/models/{_segment(model)}/{action}",
                json={},
                timeout=timeouts,
            )
        except httpx.HTTPError as exc:
            raise WorkerCallError(
                worker=worker.id, reason=f"{action} call failed: {exc!r}"
            ) from exc
        if response.status_code != 200:
            raise LoadFailedError(
                model=model, worker=worker.id, reason=f"{action}: {_reason(response)}"
            )

    async def live_sequences(self, worker: WorkerRecord, model: str) -> int:
        """Sequences of ``model`` running on ``worker`` (``GET .../sequences``); 0 from a
        worker that does not know the call. Raises ``WorkerCallError`` when it cannot be
        reached or answers something else."""
        try:
            response = await self._http.get(
                f"{worker.url}/v2/repository/models/{_segment(model)}/sequences"
            )
        except httpx.HTTPError as exc:
            raise WorkerCallError(
                worker=worker.id, reason=f"sequences call failed: {exc!r}"
            ) from exc
        if response.status_code == 404:
            return 0
        try:
            live = response.json().get("live") if response.status_code == 200 else None
        except (ValueError, AttributeError):
            live = None
        if not isinstance(live, int) or isinstance(live, bool) or live < 0:
            raise WorkerCallError(
                worker=worker.id, reason=f"sequences of '{model}': {_reason(response)}"
            )
        return live

    async def fetch_progress(self, worker: WorkerRecord, model: str) -> tuple[int, int] | None:
        """(bytes downloaded, bytes needed) of a load of ``model`` under way on ``worker``
        (``GET .../progress``); None when it downloads nothing now, or cannot say (an older
        worker, Triton, a failed call): progress is best effort and never fails a load."""
        try:
            response = await self._http.get(
                f"{worker.url}/v2/repository/models/{_segment(model)}/progress",
                timeout=_PROGRESS_TIMEOUT_S,
            )
            doc = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("fetching") is not True:
            return None
        fetched, total = doc.get("bytes_fetched"), doc.get("bytes_total")
        if not (isinstance(fetched, int) and isinstance(total, int)) or min(fetched, total) < 0:
            return None
        return fetched, total

    async def served_versions(self, url: str, model: str) -> list[str] | None:
        """The numbered versions of ``model`` the worker at ``url`` serves now (its
        ``GET /v2/models/{name}``: the version folders its config's ``version_policy``
        chose), in the worker's order; None on any failure (unreachable, slow, not loaded
        there, an answer without a list of strings): it is shown, never acted on."""
        try:
            response = await self._http.get(
                f"{url}/v2/models/{_segment(model)}", timeout=_VERSIONS_TIMEOUT_S
            )
            doc = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        versions = doc.get("versions") if isinstance(doc, dict) else None
        if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
            return None
        return versions

    async def is_live(self, url: str) -> bool:
        """One liveness probe of the worker at ``url``."""
        return await probe_live(self._http, url)

    async def close(self) -> None:
        await self._http.aclose()


def _report(duration_s: float, response: httpx.Response) -> LoadReport:
    """The load's report from the worker's answer; cache ``unknown`` when it says nothing
    usable (an empty body: Triton, or a worker from before the answer carried it)."""
    try:
        doc = response.json()
    except ValueError:
        return LoadReport(duration_s=duration_s)
    if not isinstance(doc, dict):
        return LoadReport(duration_s=duration_s)
    cache, fetched, fetch_s = doc.get("cache"), doc.get("bytes_fetched"), doc.get("fetch_s")
    if (
        cache not in _CACHE_OUTCOMES
        or not isinstance(fetched, int)
        or isinstance(fetched, bool)
        or fetched < 0
        or not isinstance(fetch_s, int | float)
        or isinstance(fetch_s, bool)
        or fetch_s < 0
    ):
        return LoadReport(duration_s=duration_s)
    return LoadReport(
        duration_s=duration_s, cache=cache, bytes_fetched=fetched, fetch_s=float(fetch_s)
    )


def _segment(model: str) -> str:
    """``model`` as one URL path segment: registration refuses names that need escaping,
    but a name from an older store must still not turn into another path or a query."""
    return quote(model, safe="")


_RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_permanent_refusal(status: int) -> bool:
    """Whether a worker's answer ``status`` to a load means it cannot succeed as asked: a
    4xx (Triton answers a load that fails on the model itself 400), except the statuses
    that ask for a retry. A 5xx (the store unreachable: 503) may pass."""
    return 400 <= status < 500 and status not in _RETRYABLE_STATUSES


def _error_text(response: httpx.Response) -> str:
    try:
        doc = response.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return str(doc["error"]).strip()
    return response.text[:500]


def _reason(response: httpx.Response) -> str:
    try:
        doc = response.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return f"{response.status_code}: {doc['error']}"
    return f"{response.status_code}: {response.text[:500]}"
