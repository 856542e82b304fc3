"""Start expensive processes ahead of their turn, a bounded number at a time.

Most of a vLLM engine's start-up (20-45 s here) is three processes importing torch and vLLM one
after the other, each busy on one core: on two cores, two engines started together are both
ready well before two started one after the other would be (a tiny-model probe: ~1.3 times
the time of one, not twice). ``Ahead`` starts the processes a module will use in the order it
will use them, keeping at most ``max_alive`` alive (an engine holds ~3 GB), so that the next
one starts while the current one works. Nothing depends on that order for correctness: a
process asked for out of turn is started there and then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar


class Startable(Protocol):
    """A process that starts when created: ready once ``wait_ready`` returns."""

    def wait_ready(self) -> object: ...

    def stop(self) -> None: ...


P = TypeVar("P", bound=Startable)


class Ahead:
    def __init__(
        self,
        starters: Mapping[str, Callable[[], Startable]],
        order: Sequence[str],
        max_alive: int = 2,
    ) -> None:
        """``starters`` start a process by name; ``order`` names those this run will use, in
        the order it will ask for them."""
        self._starters = dict(starters)
        self._order = list(order)
        self._max_alive = max_alive
        self._alive: dict[str, Startable] = {}
        self._started: set[str] = set()
        self._ready: set[str] = set()

    def get(self, name: str, kind: type[P]) -> P:
        """``name``'s process, ready; the next ones in the order start meanwhile."""
        if name not in self._started:
            self._start(name)
        self._fill()
        process = self._alive.get(name)
        if process is None:
            raise RuntimeError(f"{name} was stopped, or failed to start")
        if name not in self._ready:
            try:
                process.wait_ready()
            except BaseException:
                self.stop(name)
                raise
            self._ready.add(name)
        assert isinstance(process, kind), (name, process)
        return process

    def start_ahead(self) -> None:
        """Start the first processes of the order now, waiting for none of them."""
        self._fill()

    @contextlib.contextmanager
    def use(self, name: str, kind: type[P]) -> Iterator[P]:
        """``name``'s process for one job: stopped on the way out, which starts the next."""
        try:
            yield self.get(name, kind)
        finally:
            self.stop(name)

    def stop(self, name: str) -> None:
        """Stop ``name``'s process (if alive) and start the next ones in its place."""
        process = self._alive.pop(name, None)
        if process is not None:
            process.stop()
        self._fill()

    def close(self) -> None:
        """Stop every process, starting no more."""
        self._order.clear()
        while self._alive:
            self.stop(next(iter(self._alive)))

    def _fill(self) -> None:
        for name in self._order:
            if len(self._alive) >= self._max_alive:
                return
            if name not in self._started:
                self._start(name)

    def _start(self, name: str) -> None:
        self._started.add(name)
        self._alive[name] = self._starters[name]()
