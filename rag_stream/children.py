"""Child processes that end with this one, however it ends (kill -9 included).

The kernel does it: a process that calls ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` is killed as soon
as its parent ends, and the request survives ``exec``. Two details shape this module:

* The "parent" is the *thread* that started the child: the signal comes when that thread ends,
  even while the process goes on (an idle pool thread that exits would take its children with
  it). So children are started from ``Starter`` threads, which live as long as their children
  should: one shared by the quick starts (``popen``), and one per vLLM engine, whose start runs
  for many seconds.
* Only the child can ask, and it must ask first thing. Our own workers call
  ``die_with_parent()``; any other program is run through this file, a launcher that asks and
  then execs it (``launched``); the processes multiprocessing spawns (vLLM's engine core) get
  the launcher inside ``spawned_children_die()``, which makes ``child_python`` (next to this
  file) their interpreter. A child whose parent had already gone by the time it asked exits at
  once: the parent puts its pid in the child's environment.

Grandchildren go with their parents, by this or their own means: vLLM's ``mp`` workers watch a
pipe from the engine core; multiprocessing's resource tracker reads a pipe that this process
and the engine core hold, and ends (removing what they left) once both have gone.

Run as ``python -I -S children.py PROGRAM [ARG...]``, this file is the launcher, so it imports
only a little of the standard library at the top.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import subprocess
    from concurrent.futures import Future

T = TypeVar("T")

_LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1
_HERE = Path(__file__).resolve()
_CHILD_PYTHON = _HERE.with_name("child_python")
# Outside the settings' RAG_STREAM_ prefix: these are for the launcher, not the configuration.
_ENV = "_RAG_STREAM_CHILD_"
_PARENT = _ENV + "OF"
_PYTHON = _ENV + "PYTHON"
_LAUNCHER = _ENV + "LAUNCHER"


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends, and exit now if
    it has already. A no-op outside Linux."""
    if not _LINUX:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    parent = os.environ.pop(_PARENT, None)  # not for this process's own children
    if parent is not None and os.getppid() != int(parent):
        os._exit(1)  # adopted already: the parent died before the request was made


class Starter:
    """A thread to start child processes from, which lives until ``close()`` or the end of the
    process. A daemon: it never holds up the interpreter's exit."""

    def __init__(self, name: str) -> None:
        self._calls: SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        from concurrent.futures import Future

        if self._closed:
            raise RuntimeError(f"{self._thread.name} is closed")
        future: Future[T] = Future()
        self._calls.put((call, future))
        return future

    def call(self, call: Callable[[], T]) -> T:
        """``call()`` on this thread, waited for."""
        if threading.current_thread() is self._thread:
            return call()
        return self.submit(call).result()

    def close(self) -> None:
        """End the thread after the calls already submitted. Children it started that are still
        running are killed then."""
        if not self._closed:
            self._closed = True
            self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)


_shared: Starter | None = None
_shared_lock = threading.Lock()


def _shared_starter() -> Starter:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Starter("rag-stream-children")
        return _shared


def _forget_shared_starter() -> None:
    global _shared
    _shared = None  # a forked child has no such thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared_starter)


def popen(args: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **options)`` from the shared starter thread, with this process's
    pid in the child's environment. The program must call ``die_with_parent()`` first thing, or
    be ``launched``."""
    import subprocess

    env = {**(options.pop("env", None) or os.environ), _PARENT: str(os.getpid())}
    return _shared_starter().call(lambda: subprocess.Popen(args, env=env, **options))


def launched(args: Sequence[str]) -> list[str]:
    """``args`` run through the launcher, for ``popen`` of a program that cannot ask itself."""
    return [sys.executable, "-I", "-S", str(_HERE), *args]


_spawning = threading.Lock()
_spawners = 0  # blocks inside spawned_children_die(), in any thread
_unwrapped: tuple[str, dict[str, str | None]] | None = None  # what the first one replaced


@contextlib.contextmanager
def spawned_children_die() -> Iterator[None]:
    """Within this block, the processes multiprocessing spawns ask to die with their parent
    before their interpreter starts. Use it on the thread that starts them: a ``Starter``.
    multiprocessing's interpreter is one for the whole process, so this holds for every thread
    while any is in such a block (two engines may start at once)."""
    if not _LINUX:
        yield
        return
    _enter_spawning()
    try:
        yield
    finally:
        _leave_spawning()


def _enter_spawning() -> None:
    global _spawners, _unwrapped
    from multiprocessing import resource_tracker, spawn

    with _spawning:
        if not _spawners and not os.access(_CHILD_PYTHON, os.X_OK):
            import logging

            logging.getLogger(__name__).warning(
                "%s is missing or not executable: spawned processes will not die with this one",
                _CHILD_PYTHON,
            )
        elif not _spawners:
            # The tracker stays out of it: it is the one that cleans up after a child that
            # died (it ends by itself once the last holder of its pipe has gone).
            resource_tracker.ensure_running()
            python = os.fsdecode(spawn.get_executable())
            values = {_PARENT: str(os.getpid()), _PYTHON: python, _LAUNCHER: str(_HERE)}
            _unwrapped = python, {name: os.environ.get(name) for name in values}
            os.environ.update(values)
            spawn.set_executable(str(_CHILD_PYTHON))
        _spawners += 1


def _leave_spawning() -> None:
    global _spawners, _unwrapped
    from multiprocessing import spawn

    with _spawning:
        _spawners -= 1
        if _spawners or _unwrapped is None:
            return
        python, saved = _unwrapped
        _unwrapped = None
        spawn.set_executable(python)
        _restore(saved)


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment (which children start with) within the block,
    then as they were."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        _restore(saved)


def _restore(saved: Mapping[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _launch(argv: list[str]) -> None:
    die_with_parent()
    env = {name: value for name, value in os.environ.items() if not name.startswith(_ENV)}
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    _launch(sys.argv[1:])
