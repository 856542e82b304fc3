"""`rag-stream ingest` and `rag-stream search` as a user runs them (real subprocesses)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from qdrant_client import QdrantClient

from rag_stream.retrieval.edge_store import EdgeVectorStore
from tests.support.pdfs import make_pdf
from tests.support.server import ROOT


def run_cli(
    data_dir: Path, models_dir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RAG_STREAM_PROFILE": "test",
        "RAG_STREAM_DATA_DIR": str(data_dir),
        "RAG_STREAM_MODELS_DIR": str(models_dir),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "rag_stream", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ingest_folders_recursively_then_search(tmp_path: Path, models_dir: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "birds" / "night").mkdir(parents=True)
    (corpus / "birds" / "heron.md").write_text(
        "# Herons\n\nThe grey heron stands still in shallow water and spears fish.\n"
    )
    (corpus / "birds" / "night" / "owls.html").write_text(
        "<h1>Owls</h1><p>Barn owls find mice in total darkness by hearing alone.</p>"
    )
    (corpus / "bikes.pdf").write_bytes(make_pdf("Oil the bicycle chain every few weeks."))
    (corpus / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    (corpus / "empty.txt").write_text("   \n")
    data = tmp_path / "data"

    first = run_cli(data, models_dir, "ingest", str(corpus), "--kb", "nature")
    assert first.returncode == 0, first.stderr
    summary = first.stdout.strip().splitlines()[-1]
    assert summary.startswith("kb nature: 3 documents (3 new, 0 replaced, 0 unchanged, 1 failed)")
    assert " chunks, " in summary and summary.endswith("chunks/s)")
    assert "empty.txt" in first.stderr and "1 file(s) of unsupported types" in first.stderr
    assert "100%" in first.stderr  # the progress bar ran to the end

    (corpus / "birds" / "heron.md").write_text(
        "# Herons\n\nThe grey heron nests in colonies high in the trees.\n"
    )
    second = run_cli(data, models_dir, "ingest", str(corpus), "--kb", "nature", "--no-progress")
    assert second.returncode == 0, second.stderr
    assert "3 documents (0 new, 1 replaced, 2 unchanged, 1 failed)" in second.stdout

    found = run_cli(data, models_dir, "search", "--kb", "nature", "how do owls find mice")
    assert found.returncode == 0, found.stderr
    first_hit = found.stdout.splitlines()[0]
    assert first_hit.startswith("1. [") and "Owls" in first_hit
    assert "Barn owls find mice" in found.stdout

    missing = run_cli(data, models_dir, "search", "--kb", "nope", "owls")
    assert missing.returncode == 1 and "'nope' not found" in missing.stderr


@pytest.mark.parametrize("backend", ["edge", "local"])
def test_ingest_explains_an_embedded_store_held_by_another_process(
    tmp_path: Path, models_dir: Path, backend: str
) -> None:
    data = tmp_path / "data"
    (tmp_path / "a.txt").write_text("some text")
    if backend == "edge":  # like a running `rag-stream serve`
        holder = EdgeVectorStore(data / "vectors")
        asyncio.run(holder.ensure(384))
        try:
            result = run_cli(data, models_dir, "ingest", str(tmp_path / "a.txt"), "--kb", "k")
        finally:
            asyncio.run(holder.close())
    else:
        (data / "qdrant").mkdir(parents=True)
        local = QdrantClient(path=str(data / "qdrant"))
        try:
            result = run_cli(
                data,
                models_dir,
                "ingest",
                str(tmp_path / "a.txt"),
                "--kb",
                "k",
                env={"RAG_STREAM_VECTOR_STORE__BACKEND": "local"},
            )
        finally:
            local.close()
    assert result.returncode == 2
    assert "in use by another process" in result.stderr
