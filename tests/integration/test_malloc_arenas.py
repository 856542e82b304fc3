"""The cap on glibc's malloc arenas (rag_stream/malloc_arenas.py), in a process that encodes
with the real embedder (the default, onnx) from several threads, as a server's request threads
do: capped, glibc keeps two arenas; without the cap, one per thread that found the heap busy
(8 seen here; 13 with the torch backend). A small workload tells the two apart as well as a
large one: 16 texts 4 times gave 2 arenas capped and 8 not in every run tried, as 64 texts 8 times
did, for a third of the CPU.
The soak (scripts/soak.py, docs/reliability.md) is where the held memory it saves shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_stream.malloc_arenas import limit_malloc_arenas

CHILD = """
import asyncio, ctypes, sys
from concurrent.futures import ThreadPoolExecutor

from rag_stream.malloc_arenas import limit_malloc_arenas

if sys.argv[1] == "capped":
    assert limit_malloc_arenas()
from rag_stream.retrieval.embedder import load_embedder

embedder = asyncio.run(load_embedder(sys.argv[2], batch_size=16, backend="onnx"))
texts = [f"Lamp {i} was lit at dusk and {i * 7} ships passed. " * (1 + i % 5) for i in range(16)]
with ThreadPoolExecutor(4) as pool:
    list(pool.map(lambda _: embedder.encode_sync(texts), range(4)))
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
out = ctypes.c_void_p(libc.fopen(sys.argv[3].encode(), b"w"))
libc.malloc_info(0, out)  # an XML report, a <heap> element per arena
libc.fclose(out)
"""


def _arenas(mode: str, embedder_path: Path, tmp_path: Path) -> int:
    report = tmp_path / f"{mode}.xml"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(embedder_path), str(report)],
        env=env,
        check=True,
        timeout=300,
    )
    return report.read_text().count("<heap nr=")


def test_capped_the_threads_share_two_arenas(embedder_path: Path, tmp_path: Path) -> None:
    assert _arenas("capped", embedder_path, tmp_path) <= 2
    # the same work uncapped: the test can tell the two apart
    assert _arenas("default", embedder_path, tmp_path) > 2


def test_glibcs_own_setting_is_left_to_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False
