"""Once its engine is up, the service leaves its start-up heap out of garbage collection and
makes young collections rarer (``rag_stream/app.py``): a stream keeps its events alive until it
ends, and CPython's default threshold walked them every ~85 tokens."""

from __future__ import annotations

import gc

from rag_stream.app import YOUNG_COLLECTION_AT
from tests.support.inprocess import InProcessFactory


async def test_a_started_service_freezes_its_heap_and_collects_young_objects_rarely(
    in_process_factory: InProcessFactory,
) -> None:
    default = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, default[1], default[2])  # CPython's own, whatever ran here before
    try:
        async with in_process_factory() as service:
            response = await service.client.get("/readyz")
            assert response.status_code == 200
            assert gc.get_threshold() == (YOUNG_COLLECTION_AT, default[1], default[2])
            assert gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*default)
