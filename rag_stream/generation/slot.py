"""EngineSlot: the engine of this process, which loads in the background after start-up."""

from __future__ import annotations

import asyncio
import contextlib

from rag_stream.errors import EngineUnavailable
from rag_stream.generation.engine import Engine


class EngineSlot:
    def __init__(self) -> None:
        self._engine: Engine | None = None
        self._ready = asyncio.Event()
        self.error: str | None = None

    def set(self, engine: Engine) -> None:
        self._engine = engine
        self._ready.set()

    def fail(self, error: str) -> None:
        self.error = error

    @property
    def loaded(self) -> Engine | None:
        return self._engine

    def get(self) -> Engine:
        """The engine now, or 503 while it loads or cannot be reached (requests never wait)."""
        if self._engine is None:
            raise EngineUnavailable(f"engine not ready: {self.error or 'still loading'}")
        if not self._engine.reachable():
            raise EngineUnavailable("engine unreachable: no engine replica answers")
        return self._engine

    async def wait(self) -> Engine:
        """The engine once loaded (producers started during start-up, e.g. takeovers)."""
        while self._engine is None:
            if self.error:
                raise EngineUnavailable(f"engine failed to start: {self.error}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1):
                    await self._ready.wait()
        return self._engine

    async def serves(self, model: str) -> bool:
        """Whether this process can continue a stream of ``model`` now: it runs that model and
        its engine is reachable. A process whose replicas are all down leaves an orphaned
        stream to one that can finish it, instead of ending it with an error."""
        engine = await self.wait()
        return engine.model_name == model and engine.reachable()

    @property
    def state(self) -> str:
        if self._engine is not None:
            return "ready" if self._engine.reachable() else "unreachable"
        return f"failed: {self.error}" if self.error else "loading"
