"""The workers' per-model Prometheus families, gathered for the admin port's ``/metrics``.

In ``zeroserve up`` the workers are child processes on ports chosen at run time, which no
Prometheus configuration can name in advance. So the admin port's ``/metrics`` scrapes every
worker the backend lists at the moment it is itself scraped, keeps the families whose names
start with the configured prefixes (by default all of a worker's page: Triton's ``nv_*``,
vLLM's ``vllm:*``, the workers' own ``zeroserve_*`` (node cache, model states) and the
families models define through ``pb_utils.MetricFamily``, whose names are the models' to
choose; a worker's registry holds no process collectors) and that the platform's page does
not already name, adds a ``worker`` label to each sample, so that one model served by two
workers gives two series, and renders them after the platform's own families. A worker
that has stopped is no longer listed, so its families are gone from the next scrape; one
that does not answer within the timeout is left out of that scrape alone.

The workers' text is passed through line by line rather than parsed into prometheus_client
families: its parser renames counters without ``_total`` (all of Triton's) on the way in.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from foundation.records import WorkerRecord

__all__ = ["WorkerMetrics", "merge_families"]

logger = logging.getLogger(__name__)

_MAX_PAGE_BYTES = 8 * 2**20
"""A worker page larger than this is left out: a model with a runaway label set must not
make the platform's own scrape hold its memory."""

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class WorkerList(Protocol):
    """Where the workers up now come from (the backend)."""

    def list_workers(self, pool: str | None = None) -> list[WorkerRecord]: ...


@dataclass
class _Family:
    name: str
    comments: list[str] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labelled(sample: str, label: str) -> str:
    """``sample`` (one exposition line) with ``label`` (``key="value"``) first in its set."""
    match = _NAME.match(sample)
    if match is None:
        return sample
    end = match.end()
    if sample.startswith("{", end):
        inside = sample.find("}", end) == end + 1
        return f"{sample[: end + 1]}{label}{'' if inside else ','}{sample[end + 1 :]}"
    return f"{sample[:end]}{{{label}}}{sample[end:]}"


def _families(page: str) -> Iterable[_Family]:
    """The families of one exposition page, in its order."""
    current: _Family | None = None
    for line in page.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                if current is None or current.name != parts[2]:
                    if current is not None:
                        yield current
                    current = _Family(parts[2])
                current.comments.append(line)
            continue
        match = _NAME.match(line)
        if match is None:
            continue
        name = match.group()
        # A histogram's or summary's _bucket, _sum and _count samples belong to the family
        # announced before them; a sample with no announcement is a family of its own.
        if current is None or not name.startswith(current.name):
            if current is not None:
                yield current
            current = _Family(name)
        current.samples.append(line)
    if current is not None:
        yield current


def merge_families(
    pages: Sequence[tuple[str, str]], prefixes: Sequence[str], exclude: Collection[str] = ()
) -> str:
    """One exposition of the families named by ``prefixes`` across ``pages`` (pairs of a
    worker id and its ``/metrics`` text), less those named in ``exclude``: each family once,
    with the HELP and TYPE lines of the first page that has it, and every page's samples
    labelled ``worker="<id>"``."""
    merged: dict[str, _Family] = {}
    for worker_id, page in pages:
        label = f'worker="{_escape(worker_id)}"'
        for family in _families(page):
            if not family.name.startswith(tuple(prefixes)) or family.name in exclude:
                continue
            into = merged.setdefault(family.name, _Family(family.name, family.comments))
            into.samples.extend(_labelled(sample, label) for sample in family.samples)
    lines = [line for family in merged.values() for line in (*family.comments, *family.samples)]
    return "".join(f"{line}\n" for line in lines)


class WorkerMetrics:
    """Scrapes the listed workers' ``/metrics`` when asked; owns its HTTP client.

    Parameters:
        workers: the backend, listing the workers up now.
        timeout_s: bound on reading one worker's page; the workers are read concurrently,
            so it bounds the whole scrape too.
        prefixes: the family-name prefixes passed through (every family by default).
    """

    def __init__(
        self,
        workers: WorkerList,
        *,
        timeout_s: float,
        prefixes: Sequence[str] = ("",),
    ) -> None:
        self._workers = workers
        self._timeout_s = timeout_s
        self._prefixes = tuple(prefixes)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s))

    async def _page(self, worker: WorkerRecord) -> str | None:
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                self._http.stream("GET", f"{worker.url}/metrics") as response,
            ):
                if response.status_code != 200:
                    return None
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > _MAX_PAGE_BYTES:
                        logger.warning(
                            "worker %s: /metrics larger than %d bytes, left out",
                            worker.id,
                            _MAX_PAGE_BYTES,
                        )
                        return None
                return body.decode("utf-8", errors="replace")
        except (httpx.HTTPError, TimeoutError) as exc:
            # A worker stopping or starting between the listing and the scrape, or one too
            # busy to answer in time: left out of this scrape alone.
            logger.debug("worker %s: /metrics not read: %r", worker.id, exc)
            return None

    async def exposition(self, exclude: Collection[str] = ()) -> str:
        """The workers' families as Prometheus text, less the families named in ``exclude``
        (the platform's own, which a page may hold once only); empty when no worker
        answers."""
        workers = self._workers.list_workers()
        if not workers:
            return ""
        pages = await asyncio.gather(*(self._page(worker) for worker in workers))
        answered = [(w.id, page) for w, page in zip(workers, pages, strict=True) if page]
        return merge_families(answered, self._prefixes, exclude)

    async def close(self) -> None:
        await self._http.aclose()
