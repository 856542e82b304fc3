"""The sample knowledge base: what the service ingests at start (in the test process,
tests/support/inprocess.py), and its kept vectors (rag_stream/ingest/sample_vectors.py) on the
real embedder, SQLite and the embedded vector store: a second data folder ingests the same docs
without embedding them and searches them alike; an edited file embeds only its new text;
vectors of another embedder, a file that cannot be read or a folder that cannot be written
change nothing but the time taken."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import anyio
import numpy as np
import pytest

from rag_stream.ingest.local import open_local_stack
from rag_stream.ingest.parsing import SUPPORTED_SUFFIXES
from rag_stream.ingest.sample_kb import SAMPLE_KB_NAME, ingest_sample_kb
from rag_stream.ingest.sample_vectors import FILE_NAME, SampleVectors, embedder_id
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.settings import load_settings
from rag_stream.store.db import upgrade
from tests.support.inprocess import InProcess
from tests.support.server import ROOT

Hits = list[tuple[str, float]]


# the service's own chunking, as `serve` and the chat page's server ingest it: the vectors one
# of them keeps in the models folder are the others'
@pytest.mark.in_process(ingest__sample_kb=True)
async def test_the_sample_kb_holds_the_project_docs(in_process: InProcess) -> None:
    client = in_process.client
    expected = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "docs").rglob("*")
        if p.suffix in SUPPORTED_SUFFIXES
    }
    assert "docs/protocol.md" in expected
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        r = await client.get("/v1/kbs/docs")
        if r.status_code == 200 and r.json()["document_count"] >= len(expected):
            break
        await asyncio.sleep(1)
    docs = (await client.get("/v1/kbs/docs/documents", params={"limit": 200})).json()["data"]
    assert {d["source"] for d in docs} == expected
    hits = (
        await client.post(
            "/v1/kbs/docs/search",
            json={"query": "server-sent events stream protocol", "mode": "dense"},  # cosine
        )
    ).json()["results"]
    assert hits and hits[0]["score"] > 0.3


def _docs(folder: Path) -> Path:
    docs = folder / "docs"
    docs.mkdir(parents=True)
    birds = "".join(f"Herons nest in the Zorblat delta, {n} pairs a spring. " for n in range(150))
    boats = "".join(f"Lock {n} opens at dawn for the barges. " for n in range(150))
    (docs / "birds.md").write_text(f"# Birds\n\n{birds}\n")
    (docs / "boats.md").write_text(f"# Boats\n\n{boats}\n")
    return docs


async def _ingest(
    data: Path, models_dir: Path, docs: Path, kept_at: Path, made_by: str | None = None
) -> tuple[Hits, SampleVectors]:
    """Ingest ``docs`` as the sample KB into the fresh data folder ``data``, with the vectors
    kept at ``kept_at`` (read as ``made_by``'s, by default the real embedder's): its search
    results, and the kept vectors as the ingest left them."""
    settings = load_settings(profile="test", data_dir=data, models_dir=models_dir)
    await anyio.to_thread.run_sync(upgrade, settings.resolved_database_url)
    async with open_local_stack(settings) as stack:
        made_by = made_by or embedder_id(stack.ingestor.embedder, settings.resolved_embedder)
        kept = SampleVectors.load(kept_at, made_by)
        summary = await ingest_sample_kb(stack.sessions, stack.ingestor, docs, kept=kept)
        assert summary is not None and summary.created == 2 and not summary.failed
        kb = await stack.ingestor.resolve_kb(SAMPLE_KB_NAME, tenant=LOCAL_TENANT)
        hits = await stack.retriever.search(kb.id, "where do herons nest", 4, mode="dense")
    return [(hit.text, round(hit.score, 5)) for hit in hits], kept


def _count(path: Path) -> int:
    with np.load(path) as data:
        return int(data["vectors"].shape[0])


async def test_a_second_data_folder_ingests_the_sample_kb_without_embedding(
    tmp_path: Path, models_dir: Path
) -> None:
    docs, path = _docs(tmp_path), tmp_path / "kept" / FILE_NAME
    first, kept = await _ingest(tmp_path / "one", models_dir, docs, path)
    assert "Herons" in first[0][0]
    chunks = _count(path)
    assert chunks >= 4 and kept.added == 0  # every chunk's vector, saved

    written = path.stat().st_mtime_ns
    second, kept = await _ingest(tmp_path / "two", models_dir, docs, path)
    assert second == first  # the same vectors, so the same hits and scores
    assert kept.added == 0 and path.stat().st_mtime_ns == written  # nothing was embedded

    # an edited file: only the chunks whose text changed are embedded
    birds = docs / "birds.md"
    birds.write_text(birds.read_text() + "\nHerons also nest in the Quorm marshes.\n")
    await _ingest(tmp_path / "three", models_dir, docs, path)
    assert 1 <= _count(path) - chunks < chunks // 2


async def test_vectors_of_another_embedder_are_not_used(tmp_path: Path, models_dir: Path) -> None:
    docs = _docs(tmp_path)
    reference, _ = await _ingest(tmp_path / "one", models_dir, docs, tmp_path / "a" / FILE_NAME)
    # a file of the same texts said to be another model's, its vectors made zero
    path = tmp_path / "b" / FILE_NAME
    await _ingest(tmp_path / "two", models_dir, docs, path, made_by="another-model|onnx")
    with np.load(path) as data:
        keys, rows = data["keys"], np.zeros_like(data["vectors"])
    np.savez(path, keys=keys, vectors=rows)  # (a path ending .npz is written as it is)
    again, _ = await _ingest(tmp_path / "three", models_dir, docs, path)
    assert again == reference  # embedded anew: zero vectors would match nothing
    assert _count(path) == 2 * len(keys)  # this model's vectors beside the other's


async def test_an_unreadable_file_or_an_unwritable_folder_changes_only_the_time(
    tmp_path: Path, models_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    docs = _docs(tmp_path)
    broken = tmp_path / "broken" / FILE_NAME
    broken.parent.mkdir()
    broken.write_bytes(b"not a numpy file")
    reference, _ = await _ingest(tmp_path / "one", models_dir, docs, broken)
    assert "Herons" in reference[0][0] and _count(broken) >= 4  # replaced by a good one

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with caplog.at_level("INFO", logger="rag_stream.ingest.sample_vectors"):
        hits, kept = await _ingest(tmp_path / "two", models_dir, docs, blocked / FILE_NAME)
    assert hits == reference
    assert "cannot keep its vectors" in caplog.text and kept.added > 0  # kept in memory only


def test_a_model_prepared_again_or_another_size_of_vector_is_another_embedder(
    tmp_path: Path,
) -> None:
    class Made:
        backend = "onnx"
        dimension = 384

    folder = tmp_path / "model"
    (folder / "onnx").mkdir(parents=True)
    (folder / "onnx" / "model.onnx").write_bytes(b"weights")
    first = embedder_id(Made(), str(folder))  # type: ignore[arg-type]
    assert embedder_id(Made(), str(folder)) == first  # type: ignore[arg-type]
    (folder / "onnx" / "model.onnx").write_bytes(b"other weights")
    assert embedder_id(Made(), str(folder)) != first  # type: ignore[arg-type]
    wider = Made()
    wider.dimension = 768
    assert embedder_id(wider, str(folder)) != embedder_id(Made(), str(folder))  # type: ignore[arg-type]
