"""Which vLLM server replica takes a request: prefix affinity by consistent hashing, with a
fall-back to the least-loaded healthy replica.

A request carries an affinity key (its conversation, or the first KV blocks of its prompt), so
every turn of one conversation, and every request sharing a long prefix, lands where that
prefix is already cached. The key is placed on a hash ring of the replicas (``_VNODES`` points
each, so replicas split the keys evenly and removing one moves only its own keys). The replica
the ring picks is skipped when it is unhealthy or has more than ``max_waiting`` requests
waiting (vLLM's ``vllm:num_requests_waiting``): then the healthy replica with the fewest
waiting takes it. ``Health`` refreshes both from each server's ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

log = logging.getLogger(__name__)

_VNODES = 64
_WAITING = re.compile(r"^vllm:num_requests_waiting(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.M)


@dataclass
class Replica:
    url: str  # the server's base URL, without /v1
    healthy: bool = True
    waiting: int = 0
    checked: bool = True  # its model and shape were checked (False: it was down at start)


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Router:
    def __init__(
        self, replicas: Sequence[Replica], max_waiting: int, round_robin: bool = False
    ) -> None:
        if not replicas:
            raise ValueError("no engine replica to route to")
        self.replicas = list(replicas)
        self._max_waiting = max_waiting
        self._round_robin = round_robin
        self._turn = 0
        ring = sorted(
            (_point(f"{r.url}#{i}"), n) for n, r in enumerate(replicas) for i in range(_VNODES)
        )
        self._points = [p for p, _ in ring]
        self._owners = [n for _, n in ring]

    def preferred(self, key: str) -> Replica:
        """The replica the ring gives ``key``, whatever its state."""
        at = bisect.bisect(self._points, _point(key)) % len(self._points)
        return self.replicas[self._owners[at]]

    def pick(self, key: str, exclude: Sequence[Replica] = ()) -> Replica | None:
        """Where to send a request with ``key``; None when no healthy replica is left."""
        if self._round_robin:
            return self._next(exclude)
        choice = self.preferred(key)
        if choice.healthy and choice not in exclude and choice.waiting <= self._max_waiting:
            return choice
        usable = [r for r in self.replicas if r.healthy and r not in exclude]
        if not usable:
            return None
        return min(usable, key=lambda r: (r.waiting, r is not choice))

    def _next(self, exclude: Sequence[Replica]) -> Replica | None:
        for _ in range(len(self.replicas)):
            replica = self.replicas[self._turn % len(self.replicas)]
            self._turn += 1
            if replica.healthy and replica not in exclude:
                return replica
        return None


class Health:
    """Polls every replica's ``/health`` and ``/metrics`` every ``interval_s``."""

    def __init__(
        self,
        router: Router,
        client: httpx.AsyncClient,
        interval_s: float,
        rejoin: Callable[[Replica], Awaitable[bool]] | None = None,
    ) -> None:
        self._router = router
        self._client = client
        self._interval = interval_s
        self._rejoin = rejoin  # asked before a replica down at start first counts as healthy
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="engine-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(r) for r in self._router.replicas))

    async def check(self, replica: Replica) -> None:
        try:
            health = await self._client.get(f"{replica.url}/health", timeout=5)
            metrics = await self._client.get(f"{replica.url}/metrics", timeout=5)
            healthy = health.status_code == 200
            found = _WAITING.search(metrics.text) if metrics.status_code == 200 else None
            replica.waiting = int(float(found.group(1))) if found else 0
        except httpx.HTTPError:
            healthy = False
        if healthy and not replica.checked:
            replica.checked = self._rejoin is None or await self._rejoin(replica)
            healthy = replica.checked
        if healthy != replica.healthy:
            log.warning("engine replica %s is %s", replica.url, "back" if healthy else "down")
        replica.healthy = healthy

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.check_all()
