"""A private redis-server that a test or a campaign can kill and start again."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.support.server import free_port


class RedisServer:
    """redis-server on a port of its own, its files in ``folder``. ``persist``: an append-only
    file with an fsync per write (what it held comes back after a kill); otherwise nothing is
    kept and it starts empty."""

    def __init__(self, folder: Path, *, unix_socket: bool = False) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.folder = folder
        # ``unix_socket``: the same server on a socket in its folder too (a Redis on the API's
        # own host); its path must fit a socket's 107 bytes
        self.socket = folder / "redis.sock" if unix_socket else None
        self.socket_url = None if self.socket is None else f"unix://{self.socket}?db=0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, persist: bool = False) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--dir", str(self.folder), "--save", ""]
        if self.socket is not None:
            command += ["--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        command += ["--appendonly", "yes", "--appendfsync", "always"] if persist else []
        command += [] if persist else ["--appendonly", "no"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "redis-server did not start"
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def wipe(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
