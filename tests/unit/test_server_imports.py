"""What a server process loads at start: on the default (embedded edge) store it never imports
qdrant-client, which costs about a second of every start (a process a test, a CLI command or a
restarted replica waits for)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY_UNUSED = ("qdrant_client", "torch", "vllm")


def _run(code: str) -> str:
    """What ``code`` prints in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout


def _loaded_after(code: str) -> list[str]:
    """The heavy libraries loaded once ``code`` has run."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {HEAVY_UNUSED!r} if m in sys.modules))"
    return [name for name in _run(probe).splitlines()[-1].split(",") if name]


def _open_store(data_dir: Path, **settings: object) -> str:
    """Code that opens the store these settings choose and prints its type."""
    return (
        "from rag_stream.settings import Settings\n"
        "from rag_stream.retrieval.stores import open_vector_store\n"
        f"s = Settings(data_dir={str(data_dir)!r}, **{settings!r})\n"
        "print(type(open_vector_store(s)).__name__)"
    )


def test_the_app_and_the_cli_load_no_qdrant_client_torch_or_vllm() -> None:
    assert _loaded_after("import rag_stream.app, rag_stream.cli, rag_stream.ingest.local") == []


def test_opening_the_default_store_loads_no_qdrant_client(tmp_path: Path) -> None:
    assert _loaded_after(_open_store(tmp_path)) == []


def test_the_local_mode_store_still_opens_qdrant_client(tmp_path: Path) -> None:
    code = _open_store(tmp_path, vector_store={"backend": "local"})
    probe = code + "\nimport sys\nprint('qdrant_client' in sys.modules)"
    assert _run(probe).split() == ["QdrantVectorStore", "True"]
