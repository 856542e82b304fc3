"""What a server process loads at start: on the default (embedded edge) store it never imports
qdrant-client, which costs about a second of every start (a process a test, a CLI command or a
restarted replica waits for)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY_UNUSED = ("qdrant_client", "torch", "vllm")


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {HEAVY_UNUSED!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return [name for name in out.stdout.strip().split(",") if name]


def test_the_app_and_the_cli_load_no_qdrant_client_torch_or_vllm() -> None:
    assert _loaded_after("import rag_stream.app, rag_stream.cli, rag_stream.ingest.local") == []


def test_opening_the_default_store_loads_no_qdrant_client(tmp_path: Path) -> None:
    code = (
        "from rag_stream.settings import Settings\n"
        "from rag_stream.retrieval.stores import open_vector_store\n"
        f"open_vector_store(Settings(data_dir={str(tmp_path)!r}))"
    )
    assert _loaded_after(code) == []


def test_the_local_mode_store_still_opens_qdrant_client(tmp_path: Path) -> None:
    code = (
        "from rag_stream.settings import Settings\n"
        "from rag_stream.retrieval.stores import open_vector_store\n"
        "s = Settings(data_dir=" + repr(str(tmp_path)) + ", vector_store={'backend': 'local'})\n"
        "print(type(open_vector_store(s)).__name__)"
    )
    probe = code + "\nimport sys\nprint('qdrant_client' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["QdrantVectorStore", "True"]
