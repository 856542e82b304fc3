"""kill -9 of `rag-stream serve` leaves none of its processes behind: not the engine core, its
resource tracker, the embedded redis-server, the vector store's worker or a parse worker,
whether the server dies while starting, while its engine loads, or in the middle of a stream.
Found by the second hostile probe (issue 36): the engine core (2.7 GB) and the resource tracker
outlived a killed server under PID 1, and the embedded Redis ran on as a daemon.

A watcher thread records every process of the server's tree while it runs (and any process
working in its data folder, where a daemon that left the tree would still be), each by pid and
start time, so a pid reused after the kill cannot pass for a survivor or hide one."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerFactory
from tests.support.server import ServerProcess
from tests.support.sse import read_stream
from tests.support.waiting import eventually_sync

pytestmark = pytest.mark.engine

GONE_WITHIN_S = 10.0  # the kernel kills them at once; this only bounds a failure
STREAM = {"prompt": "Count slowly from one to a thousand.", "max_tokens": 400}


@dataclass
class Seen:
    started: str  # field 22 of /proc/PID/stat: with the pid, names one process for good
    command: str  # the latest command line seen (the engine core renames itself)
    name: str


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (index 0 is field 3, the state)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str) -> bool:
    fields = _stat(pid)
    # a zombie has ended (only its exit status waits for a parent to collect it)
    return fields is not None and fields[19] == started and fields[0] != "Z"


class ProcessWatch:
    """Every process that has been in ``root``'s tree, or working under ``folder``, while
    watched."""

    def __init__(self, root: int, folder: Path) -> None:
        self._root = root
        self._folder = str(folder.resolve())
        self.seen: dict[int, Seen] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def commands(self) -> list[str]:
        with self._lock:
            return [seen.command for seen in self.seen.values()]

    def names(self) -> set[str]:
        with self._lock:
            return {seen.name for seen in self.seen.values()}

    def has(self, fragment: str) -> bool:
        return any(fragment in command for command in self.commands())

    def stop(self) -> dict[int, Seen]:
        self._stop.set()
        self._thread.join(5)
        return dict(self.seen)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._scan()
            self._stop.wait(0.05)

    def _scan(self) -> None:
        parents: dict[int, int] = {}
        started: dict[int, str] = {}
        working_here: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            fields = _stat(pid)
            if fields is None or fields[0] == "Z":
                continue
            parents[pid], started[pid] = int(fields[1]), fields[19]
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd == self._folder or cwd.startswith(self._folder + "/"):
                working_here.add(pid)
        tree = {self._root} | working_here
        grew = True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in tree} - tree
            tree |= more
            grew = bool(more)
        for pid in tree - {self._root}:
            if pid not in started:
                continue
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            with self._lock:
                known = self.seen.get(pid)
                if known is None or known.started != started[pid]:
                    self.seen[pid] = Seen(started[pid], command, name)
                else:
                    known.command, known.name = command, name


@pytest.fixture
def watched_server(
    server_factory: ServerFactory, tiny_model: Path, tmp_path: Path
) -> Iterator[tuple[ServerProcess, ProcessWatch]]:
    """A server on the tiny model and every embedded part (Redis, vector store, SQLite), not
    waited for, and the watch on its processes."""
    data = tmp_path / "data"
    server = server_factory(wait=False, data_dir=data, RAG_STREAM_MODEL=str(tiny_model))
    watch = ProcessWatch(server.proc.pid, data)
    yield server, watch
    watch.stop()


def _kill_and_expect_no_survivor(server: ServerProcess, watch: ProcessWatch) -> None:
    """kill -9 of the server process alone (not its group: that is what a supervisor or the OOM
    killer does), then every process it had must be gone within the deadline."""
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(30)
    killed = time.monotonic()
    seen = watch.stop()
    assert seen, "the server had no child process to check"

    def survivors() -> list[str]:
        return [
            f"{pid} {s.name}: {s.command[:120]}"
            for pid, s in seen.items()
            if _alive(pid, s.started)
        ]

    try:
        eventually_sync(
            lambda: not survivors(),
            "every process of the killed server gone",
            timeout_s=GONE_WITHIN_S,
        )
    except AssertionError:
        left = survivors()
        for pid, s in seen.items():  # do not leave them to the rest of the run
            if _alive(pid, s.started):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(
            f"{len(left)} of {len(seen)} processes outlived the server by {GONE_WITHIN_S} s:\n"
            + "\n".join(left)
        ) from None
    print(f"all {len(seen)} gone {time.monotonic() - killed:.2f} s after the kill:")
    for s in seen.values():
        print(f"  {s.name}: {s.command[:100]}")


def _ready(server: ServerProcess) -> bool:
    try:
        return httpx.get(server.url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_server_killed_while_starting_leaves_no_process(
    watched_server: tuple[ServerProcess, ProcessWatch],
) -> None:
    server, watch = watched_server
    # its embedded Redis and vector store up, its engine not yet begun (vLLM takes seconds
    # to import before it starts one)
    eventually_sync(
        lambda: watch.has("edge_worker") and "redis-server" in watch.names(),
        "the embedded Redis and vector store started",
        timeout_s=120,
    )
    assert not watch.has("multiprocessing"), watch.commands()
    _kill_and_expect_no_survivor(server, watch)


def test_a_server_killed_while_its_engine_loads_leaves_no_process(
    watched_server: tuple[ServerProcess, ProcessWatch],
) -> None:
    server, watch = watched_server
    eventually_sync(
        lambda: watch.has("EngineCore"), "the engine core loading", timeout_s=300, every_s=0.02
    )
    assert not _ready(server)
    _kill_and_expect_no_survivor(server, watch)


def test_a_server_killed_mid_stream_leaves_no_process(
    watched_server: tuple[ServerProcess, ProcessWatch],
) -> None:
    server, watch = watched_server
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        client.post("/v1/kbs", json={"name": "killed"}).raise_for_status()
        note = ("note.txt", b"A parse worker read this file.", "text/plain")
        client.post("/v1/kbs/killed/documents", files={"file": note}).raise_for_status()
        frames = read_stream(client, "POST", "/v1/generate", json=STREAM, stop_after=4)
        assert frames[-1].event == "token", frames
        sid = frames[0].data["stream_id"]
        assert client.get(f"/v1/streams/{sid}").json()["status"] == "running"
    for part in ("EngineCore", "resource_tracker", "edge_worker", "parse_worker"):
        assert watch.has(part), (part, watch.commands())
    assert "redis-server" in watch.names()
    _kill_and_expect_no_survivor(server, watch)
