"""The sync client is generated from the async one (scripts/gen_sync_client.py): the committed
sync_client.py and sync_stream.py are exactly what the script writes from the async modules
now, so a change to one side only fails here."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "rag_stream" / "client"
GENERATED = ("sync_client.py", "sync_stream.py")


def test_the_committed_sync_client_is_what_the_generator_writes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gen_sync_client.py", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr  # (unasync is in the dev extra)
    for name in GENERATED:
        committed = (CLIENT / name).read_text().splitlines(keepends=True)
        fresh = (tmp_path / name).read_text().splitlines(keepends=True)
        diff = "".join(difflib.unified_diff(committed, fresh, "committed", "generated"))
        assert not diff, f"{name} is stale: run scripts/gen_sync_client.py\n{diff}"


def test_the_generated_files_say_so_and_from_what() -> None:
    for name in GENERATED:
        head = (CLIENT / name).read_text().splitlines()[0]
        assert head.startswith(f"# Generated from {name.replace('sync_', 'async_')} by "), head
