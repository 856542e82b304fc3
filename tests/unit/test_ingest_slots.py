"""The bound on uploads ingested at once: per process and per tenant, a slot given back once."""

from __future__ import annotations

import pytest

from rag_stream.errors import TooManyRequests
from rag_stream.ingest.slots import IngestSlots


def test_past_the_process_bound_any_tenant_gets_a_429_with_retry_after() -> None:
    slots = IngestSlots(limit=2, per_tenant=2, retry_after_s=7)
    held = [slots.take("a"), slots.take("b")]
    with pytest.raises(TooManyRequests) as refused:
        slots.take("c")
    assert refused.value.retry_after_s == 7
    assert "ingesting 2 uploads" in refused.value.message
    held[0].release()
    slots.take("c")


def test_past_its_own_bound_a_tenant_gets_a_429_while_others_go_on() -> None:
    slots = IngestSlots(limit=4, per_tenant=1, retry_after_s=2)
    first = slots.take("a")
    with pytest.raises(TooManyRequests, match="1 of your uploads"):
        slots.take("a")
    slots.take("b")
    first.release()
    first.release()  # a second release gives back nothing more
    assert slots.active == 1
    slots.take("a")
    with pytest.raises(TooManyRequests):
        slots.take("a")
