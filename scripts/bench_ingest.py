"""Benchmark ingestion throughput and search latency, in-process (no server).

1. Throughput: the same synthetic documents go through the real ingestion path (chunking,
   batched embedding, Qdrant local upsert, SQL commit) and, in the same run, their chunk texts go
   through a bare ``SentenceTransformer.encode`` with the same batch size. Repetitions alternate
   the order; the report gives the median and the range, and the ratio of the medians.
2. Search latency of ``Retriever.search`` (query embedding + Qdrant local + SQL join) at 1k
   chunks (the real chunks from step 1) and at 20k chunks. For 20k, the extra chunks get random
   unit vectors instead of real embeddings (embedding 20k chunks on 2 CPU cores takes too long);
   Qdrant local's search cost does not depend on the vector values.

    .venv/bin/python scripts/bench_ingest.py [--docs 24] [--reps 3] [--queries 100]

Raw results go to docs/bench/ingest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np
from qdrant_client import AsyncQdrantClient
from sqlalchemy import insert, select

from rag_stream.ingest.documents import DocumentDraft
from rag_stream.ingest.parsing import parse_markdown
from rag_stream.ingest.service import Ingestor
from rag_stream.ingest.writer import IngestResult
from rag_stream.retrieval.edge_bm25 import EdgeBm25
from rag_stream.retrieval.embedder import LoadedEmbedder, TorchEmbedder, load_embedder
from rag_stream.retrieval.qdrant_store import QdrantVectorStore
from rag_stream.retrieval.retriever import Retriever
from rag_stream.retrieval.vector_store import VectorPoint, VectorQuery
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.settings import IngestSettings, load_settings
from rag_stream.store.db import create_db, upgrade
from rag_stream.store.models import Chunk, Document, KnowledgeBase, new_id

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import command, percentile, write_json  # noqa: E402

WORDS = """
river mountain engine protocol stream token cache server garden window letter market harbour
signal circuit thunder lantern meadow archive pattern vector kernel bridge forest planet rhythm
castle pencil mirror valley orbit crystal ladder compass harvest journey battery canvas silver
shadow whisper timber glacier orchard beacon summit
""".split()  # noqa: SIM905 (a paragraph of words reads better than a list literal)


def synthetic_docs(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)

    def sentence() -> str:
        words = rng.choices(WORDS, k=rng.randint(8, 18))
        return " ".join(words).capitalize() + "."

    docs = []
    for d in range(n):
        parts = [f"# Document {d}"]
        for s in range(6):
            parts.append(f"## Section {s}")
            for _ in range(rng.randint(2, 4)):
                parts.append(" ".join(sentence() for _ in range(rng.randint(3, 7))))
        docs.append("\n\n".join(parts) + "\n")
    return docs


class Stores:
    """SQLite and Qdrant local in a fresh folder, with the real ingestor and retriever."""

    def __init__(self, root: Path, embedder: LoadedEmbedder, ingest: IngestSettings):
        self.url = f"sqlite+aiosqlite:///{root / 'db.sqlite'}"
        self.root = root
        self.embedder = embedder
        self.ingest = ingest

    async def open(self) -> None:
        await anyio.to_thread.run_sync(upgrade, self.url)  # Alembic runs its own event loop
        self.db_engine, self.sessions = create_db(self.url)
        self.vectors = QdrantVectorStore(AsyncQdrantClient(path=str(self.root / "qdrant")))
        await self.vectors.ensure(self.embedder.dimension)
        sparse = EdgeBm25()
        self.ingestor = Ingestor(
            self.sessions, self.vectors, self.embedder, self.ingest, sparse=sparse
        )
        self.retriever = Retriever(self.sessions, self.vectors, self.embedder, sparse=sparse)

    async def new_kb(self) -> str:
        async with self.sessions() as session:
            kb = KnowledgeBase(name=new_id())
            session.add(kb)
            await session.commit()
            return kb.id

    async def close(self) -> None:
        await self.vectors.close()
        await self.db_engine.dispose()


def drafts(docs: list[str]) -> list[DocumentDraft]:
    return [
        DocumentDraft(f"doc {i}", parse_markdown(text), source=f"doc-{i}.md")
        for i, text in enumerate(docs)
    ]


async def ingest_all(stores: Stores, kb: str, docs: list[str], batched: bool) -> tuple[int, float]:
    """Chunks stored and seconds taken. ``batched`` is the file path (CLI, sample KB); without
    it every document is ingested on its own, as one HTTP upload is."""
    created: list[int] = []

    def count(_: object, outcome: object) -> None:
        assert isinstance(outcome, IngestResult) and outcome.created, outcome
        created.append(outcome.document.chunk_count)

    began = time.perf_counter()
    if batched:
        async with stores.ingestor.batch(kb, count) as batch:
            for draft in drafts(docs):
                await batch.add(draft)
    else:
        for draft in drafts(docs):
            count(None, await stores.ingestor.ingest(kb, draft, tenant=LOCAL_TENANT))
    return sum(created), time.perf_counter() - began


async def chunk_texts(stores: Stores, kb: str) -> list[str]:
    async with stores.sessions() as session:
        rows = await session.scalars(
            select(Chunk.text).where(Chunk.kb_id == kb).order_by(Chunk.document_id, Chunk.ordinal)
        )
        return list(rows)


def raw_encode(model: object, texts: list[str], batch_size: int) -> float:
    began = time.perf_counter()
    model.encode(  # type: ignore[attr-defined]
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return time.perf_counter() - began


async def add_random_chunks(stores: Stores, kb: str, count: int, dim: int) -> None:
    rng = np.random.default_rng(11)
    per_doc = 100
    for d in range(0, count, per_doc):
        doc_id = new_id()
        n = min(per_doc, count - d)
        ids = [new_id() for _ in range(n)]
        vecs = rng.standard_normal((n, dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        await stores.vectors.upsert(
            [VectorPoint(c, v, kb, doc_id, {}) for c, v in zip(ids, vecs, strict=True)]
        )
        async with stores.sessions() as session:
            session.add(
                Document(id=doc_id, kb_id=kb, title=f"random {d}", content_hash=doc_id,
                         text="x", meta={}, chunk_count=n)
            )  # fmt: skip
            await session.flush()
            await session.execute(
                insert(Chunk),
                [
                    {"id": c, "document_id": doc_id, "kb_id": kb, "ordinal": i, "text": "x",
                     "start": 0, "end": 1, "heading": None, "token_count": 1}
                    for i, c in enumerate(ids)
                ],
            )  # fmt: skip
            await session.commit()


def percentiles(times_ms: list[float]) -> tuple[float, float]:
    return percentile(times_ms, 0.5), percentile(times_ms, 0.99)


async def latency(
    stores: Stores, kb: str, queries: list[str], top_k: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """p50/p99 of Retriever.search, and of the Qdrant query alone (same kb filter)."""
    for q in queries[:5]:  # warm-up
        await stores.retriever.search(kb, q, top_k)
    full: list[float] = []
    for q in queries:
        began = time.perf_counter()
        await stores.retriever.search(kb, q, top_k)
        full.append((time.perf_counter() - began) * 1000)
    vectors = await stores.embedder.embed(queries)
    qdrant: list[float] = []
    for vector in vectors:
        began = time.perf_counter()
        await stores.vectors.search(kb, VectorQuery("dense", vector), 3 * top_k + 10)
        qdrant.append((time.perf_counter() - began) * 1000)
    return percentiles(full), percentiles(qdrant)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} (min {min(values):.1f}, max {max(values):.1f})"


async def main(args: argparse.Namespace) -> None:
    settings = load_settings(profile="default")
    ingest = settings.ingest
    # the service's embedder (onnx by default); the raw comparison is sentence-transformers
    embedder = await load_embedder(
        settings.resolved_embedder, ingest.embed_batch_size, settings.embedder_backend
    )
    model = (await TorchEmbedder.load(settings.resolved_embedder))._model
    print(f"embedder backend: {embedder.backend}")
    docs = synthetic_docs(args.docs)
    await embedder.embed(["warm up the model once"] * 8)
    with tempfile.TemporaryDirectory() as tmp:  # warm up the whole ingestion path once
        warm = Stores(Path(tmp), embedder, ingest)
        await warm.open()
        await ingest_all(warm, await warm.new_kb(), synthetic_docs(2, seed=1), batched=True)
        await warm.close()

    ours: list[float] = []
    single: list[float] = []
    raw: list[float] = []
    chunks = 0
    texts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        kept: tuple[Stores, str] | None = None
        for rep in range(args.reps):
            stores = Stores(Path(tmp) / f"rep{rep}", embedder, ingest)
            await stores.open()
            kb, kb_single = await stores.new_kb(), await stores.new_kb()
            # The order rotates between repetitions so drifting machine load hits all three.
            runs = ["ours", "raw", "single"]
            runs = runs[rep % 3 :] + runs[: rep % 3]
            if not texts:  # the chunk texts raw encode gets: those our path stores
                runs.remove("ours")
                runs.insert(0, "ours")
            for run in runs:
                if run == "ours":
                    chunks, seconds = await ingest_all(stores, kb, docs, batched=True)
                    ours.append(chunks / seconds)
                    texts = await chunk_texts(stores, kb)
                elif run == "single":
                    n, seconds = await ingest_all(stores, kb_single, docs, batched=False)
                    single.append(n / seconds)
                else:
                    raw.append(len(texts) / raw_encode(model, texts, ingest.embed_batch_size))
            print(
                f"rep {rep} ({', '.join(runs)}): batched {ours[-1]:.1f}, one by one "
                f"{single[-1]:.1f}, raw encode {raw[-1]:.1f} chunks/s",
                flush=True,
            )
            if kept is None:
                kept = (stores, kb)
            else:
                await stores.close()
        assert kept is not None
        stores, kb = kept
        rng = random.Random(3)
        queries = [" ".join(rng.choices(WORDS, k=rng.randint(3, 8))) for _ in range(args.queries)]
        results = {}
        size = chunks
        for target in (1_000, 20_000):
            # The real chunks of one run, topped up with random-vector chunks to the target.
            await add_random_chunks(stores, kb, max(0, target - size), embedder.dimension)
            size = max(size, target)
            results[target] = await latency(stores, kb, queries, args.top_k)
            (p50, p99), (q50, q99) = results[target]
            print(f"search at {target} chunks: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
                  f"(Qdrant query alone: p50 {q50:.1f} ms, p99 {q99:.1f} ms)")  # fmt: skip
        await stores.close()

    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}"
    )
    print(f"documents: {args.docs}, real chunks per run: {chunks}, chunk_tokens: "
          f"{ingest.chunk_tokens}, overlap: {ingest.chunk_overlap}, "
          f"batch size: {ingest.embed_batch_size}, repetitions: {args.reps}")  # fmt: skip
    print(f"ingestion, batched (files: CLI, sample KB), chunks/s: {spread(ours)}")
    print(f"ingestion, one document at a time (HTTP uploads), chunks/s: {spread(single)}")
    print(f"raw SentenceTransformer.encode, chunks/s: {spread(raw)}")
    batched = statistics.median(ours) / statistics.median(raw)
    paired = ", ".join(f"{o / r:.3f}" for o, r in zip(ours, raw, strict=True))
    print(f"ratio of medians, batched / raw: {batched:.3f} (per repetition: {paired})")
    one_by_one = statistics.median(single) / statistics.median(raw)
    print(f"ratio of medians, one by one / raw: {one_by_one:.3f}")
    report = {
        "command": command(),
        "machine": {"arch": platform.machine(), "cores": os.cpu_count()},
        "documents": args.docs,
        "chunks_per_run": chunks,
        "chunk_tokens": ingest.chunk_tokens,
        "chunk_overlap": ingest.chunk_overlap,
        "batch_size": ingest.embed_batch_size,
        "embedder_backend": embedder.backend,
        "chunks_per_s": {"batched": ours, "one_by_one": single, "raw_encode": raw},
        "search_ms": {
            str(target): {"p50": p50, "p99": p99, "qdrant_p50": q50, "qdrant_p99": q99}
            for target, ((p50, p99), (q50, q99)) in results.items()
        },
    }
    write_json(args.json, report)
    for target, ((p50, p99), (q50, q99)) in results.items():
        print(f"search top_k={args.top_k} at {target} chunks ({args.queries} queries): "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms; Qdrant alone p50 {q50:.1f} ms, "
              f"p99 {q99:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "bench" / "ingest.json")
    asyncio.run(main(parser.parse_args()))
