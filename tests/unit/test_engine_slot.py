"""The engine slot decides whether this process takes requests and continues orphaned streams:
only with its model loaded and its engine reachable (e.g. at least one replica healthy)."""

from __future__ import annotations

import pytest

from rag_stream.errors import EngineUnavailable
from rag_stream.generation.slot import EngineSlot
from tests.support.fakes import stub_engine


class _Unreachable:
    """Wraps an engine whose replicas are all down."""

    def __init__(self) -> None:
        self._engine = stub_engine()
        self.model_name = self._engine.model_name

    def reachable(self) -> bool:
        return False


async def test_a_reachable_engine_serves_its_own_model_only() -> None:
    slot = EngineSlot()
    slot.set(stub_engine())
    model = slot.get().model_name
    assert slot.state == "ready"
    assert await slot.serves(model)
    assert not await slot.serves(model + "-other")


async def test_an_unreachable_engine_neither_takes_requests_nor_continues_streams() -> None:
    slot = EngineSlot()
    engine = _Unreachable()
    slot.set(engine)  # type: ignore[arg-type]
    assert slot.state == "unreachable"  # what /readyz shows
    with pytest.raises(EngineUnavailable, match="unreachable"):
        slot.get()
    # an orphaned stream of this model is left to a process that can finish it
    assert not await slot.serves(engine.model_name)


def test_a_loading_engine_is_a_503_not_a_wait() -> None:
    slot = EngineSlot()
    assert slot.state == "loading"
    with pytest.raises(EngineUnavailable, match="still loading"):
        slot.get()
