"""How many uploads one process ingests at once, in all and per tenant.

Embedding is CPU-bound and shares the cores with generation: past a few ingests at once more of
them only queue inside the embedder while holding their text in memory, so one more is refused
(429 with Retry-After) rather than queued. A slot is taken once the upload is parsed and kept
until its ingest ends, in its request or in the background.
"""

from __future__ import annotations

from collections import Counter

from rag_stream.errors import TooManyRequests


class IngestSlot:
    """One running ingest's place; ``release`` gives it back (once, whatever happens)."""

    def __init__(self, slots: IngestSlots, tenant: str) -> None:
        self._slots = slots
        self._tenant = tenant
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._give_back(self._tenant)


class IngestSlots:
    def __init__(self, limit: int, per_tenant: int, retry_after_s: int) -> None:
        self._limit = limit
        self._per_tenant = per_tenant
        self._retry_after_s = retry_after_s
        self._by_tenant: Counter[str] = Counter()

    @property
    def active(self) -> int:
        return sum(self._by_tenant.values())

    def take(self, tenant: str) -> IngestSlot:
        """A slot for ``tenant``; TooManyRequests when the process or the tenant has none."""
        if self.active >= self._limit:
            raise TooManyRequests(
                f"this server is ingesting {self._limit} uploads already; retry shortly",
                retry_after_s=self._retry_after_s,
            )
        if self._by_tenant[tenant] >= self._per_tenant:
            raise TooManyRequests(
                f"{self._per_tenant} of your uploads are being ingested already; retry once one "
                "has finished",
                retry_after_s=self._retry_after_s,
            )
        self._by_tenant[tenant] += 1
        return IngestSlot(self, tenant)

    def _give_back(self, tenant: str) -> None:
        self._by_tenant[tenant] -= 1
        if self._by_tenant[tenant] <= 0:
            del self._by_tenant[tenant]
