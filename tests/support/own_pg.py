"""A PostgreSQL cluster of a test's (or a campaign's) own, which it may stop, restart and
start again: the machine's server is shared by everything else."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support.server import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")


class OwnPostgres:
    """A PostgreSQL 15 cluster in a folder, run as the postgres user (initdb refuses root)."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"
        folder.mkdir(parents=True)
        shutil.chown(folder, "postgres", "postgres")
        self._as_postgres(PG_BIN / "initdb", "-D", str(folder / "data"), "-U", "postgres",
                          "--auth=trust", "-E", "UTF8")  # fmt: skip

    def _as_postgres(self, *command: str | Path) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *map(str, command)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def _ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        self._as_postgres(PG_BIN / "pg_ctl", "-D", str(self.folder / "data"), "-o", options,
                          "-l", str(self.folder / "log"), "-w", *args)  # fmt: skip

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """Stop at once (no shutdown checkpoint: the crash path), then start."""
        self._ctl("-m", "immediate", "restart")

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")
