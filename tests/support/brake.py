"""Slowing a real engine from outside, so a test that interrupts a stream finds it running.

A stream on the tiny model lasts about a second. On a busy machine (two lanes of tests on two
cores) a test's reader can trail it by more than that, and would then interrupt a stream that
has already ended. ``Brake`` lets the engine cores run a small share of the time (SIGSTOP and
SIGCONT from a thread), so the stream lasts many times longer than any such lag; ``hold`` stops
them outright while the test checks the stream is running and interrupts it, so nothing can end
the stream in between. Leaving the ``with`` lets them run at full speed again.

Only the engine core is stopped: the API process, its event log and the readers run on, as they
would beside an engine that is slow for any other reason.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import TracebackType

import psutil


def engine_cores(*pids: int, direct: bool = False) -> list[int]:
    """The vLLM engine cores under the processes ``pids`` (``rag-stream serve`` or vLLM
    servers): their descendants whose command line holds ``EngineCore``, the title vLLM gives
    them (``direct``: their children only, not their servers' cores below them). A process that
    has ended counts for none (a replica an earlier test killed); at least one must be found."""
    cores = []
    for pid in pids:
        with suppress(psutil.NoSuchProcess):
            children = psutil.Process(pid).children(recursive=not direct)
            cores += [c.pid for c in children if "EngineCore" in " ".join(_cmdline(c))]
    if not cores:
        raise LookupError(f"processes {pids} run no vLLM engine core")
    return cores


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # ended meanwhile
        return []


class Brake:
    """While in its ``with``, the processes run ``running_s`` in every ``running_s + stopped_s``."""

    def __init__(self, pids: list[int], running_s: float = 0.03, stopped_s: float = 0.25) -> None:
        self.pids = pids
        self.running_s = running_s
        self.stopped_s = stopped_s
        self._lock = threading.Lock()
        self._held = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, daemon=True)

    def __enter__(self) -> Brake:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        """Full speed from now on (leaving the ``with`` does this too)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self._held = False
            self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """The processes stop now, and stay stopped until ``release``."""
        with self._lock:
            self._held = True
            self._signal(signal.SIGSTOP)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """The processes stay stopped for the block (they are when it begins)."""
        self.stop()
        try:
            yield
        finally:
            with self._lock:
                self._held = False

    def _cycle(self) -> None:
        while not self._done.is_set():
            with self._lock:
                if not self._held:
                    self._signal(signal.SIGCONT)
            if self._done.wait(self.running_s):
                return
            with self._lock:
                self._signal(signal.SIGSTOP)
            self._done.wait(self.stopped_s)

    def _signal(self, number: int) -> None:
        for pid in self.pids:
            with suppress(ProcessLookupError):  # killed by the test itself
                os.kill(pid, number)
