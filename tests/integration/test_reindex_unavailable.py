"""`rag-stream reindex` with the database gone after its migration says so in one line.

An API container runs ``rag-stream reindex && rag-stream serve`` at start (deploy/compose.yaml).
PostgreSQL's first start answers, stops and starts again (its initialisation): a reindex that
migrated on the first server then lost it printed a long traceback ending in asyncpg's
"Connect call failed", where one line saying the database is unreachable is what an operator
needs; the container's restart policy then tries again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_stream import cli, preflight
from rag_stream.settings import Settings


def test_reindex_with_the_database_unreachable_says_so_in_one_line(
    tmp_path: Path,
    models_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in {
        "PROFILE": "test",
        "DATA_DIR": str(tmp_path),
        "MODELS_DIR": str(models_dir),
        "DATABASE_URL": "postgresql+asyncpg://rag@127.0.0.1:1/rag",  # nothing listens there
    }.items():
        monkeypatch.setenv(f"RAG_STREAM_{name}", value)

    def migrated(_settings: Settings) -> None:  # the migration ran, then the server went away
        pass

    monkeypatch.setattr(preflight, "migrate", migrated)
    assert cli.main(["reindex", "--no-progress"]) == 1
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()  # one line, no traceback
    assert line.startswith("rag-stream reindex: database unavailable"), line
