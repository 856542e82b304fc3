"""Retrieval quality and search latency, in-process (no server), on both embedded backends.

1. Quality: the evaluation set in scripts/data/retrieval_eval/ (Chinese technical articles and
   English READMEs written for it; every question paraphrases one passage and is labelled with
   it) is ingested into one knowledge base (the real path: chunking, embedding, BM25, SQL).
   Each question is searched in each mode; a hit counts when its chunk covers at least half of
   the labelled passage (or the passage covers half of the chunk). Reported by language:
   recall@1/@3/@5 and MRR (over the top 5).
2. Latency of ``Retriever.search`` end to end (query embedding, BM25 encoding, vector store,
   SQL join), and of the query embedding and the store's search alone, at 1k, 20k and 200k
   chunks spread over 20 knowledge bases, searching the one that holds the evaluation set. The
   extra chunks are real SQL rows with random unit vectors and BM25 vectors of random words
   (embedding 200k chunks on 2 cores takes an hour; the search cost does not depend on the
   values). Edge is measured right after the upload (nothing indexed) and after ``optimize()``.
3. Ingestion: the real batched path on edge against a bare ``SentenceTransformer.encode`` of
   the same chunk texts, alternating, median of the repetitions.

    .venv/bin/python scripts/bench_retrieval.py [--sizes 1000 20000 200000] [--local-max 200000]
        [--backends edge local] [--local-queries 5] [--reps 3] [--out retrieval.json]

Raw results go to docs/bench/retrieval.json (``--out``). Local mode past 20k chunks runs
``--local-queries`` queries per mode (seconds each). The evaluation set here is set A; the
held-out set B and the RRF and BM25-encoder studies are in bench_retrieval_quality.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from qdrant_client import AsyncQdrantClient
from sqlalchemy import insert

from rag_stream.ingest.documents import DocumentDraft
from rag_stream.ingest.parsing import parse_markdown
from rag_stream.ingest.service import Ingestor
from rag_stream.retrieval.edge_bm25 import EdgeBm25
from rag_stream.retrieval.edge_store import EdgeVectorStore
from rag_stream.retrieval.embedder import LoadedEmbedder, load_embedder
from rag_stream.retrieval.qdrant_store import QdrantVectorStore
from rag_stream.retrieval.retriever import Retriever, SearchHit
from rag_stream.retrieval.sparse import SparseEncoder
from rag_stream.retrieval.vector_store import VectorPoint, VectorQuery
from rag_stream.schemas.kbs import SearchMode
from rag_stream.settings import IngestSettings, load_settings
from rag_stream.store.db import create_db, upgrade
from rag_stream.store.models import Chunk, Document, KnowledgeBase, new_id

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import command, percentile, write_json  # noqa: E402

EVAL = ROOT / "scripts" / "data" / "retrieval_eval"
MODES: list[SearchMode] = ["dense", "sparse", "hybrid"]
KBS = 20


@dataclass
class Passage:
    doc: str
    start: int
    end: int


@dataclass
class EvalSet:
    docs: list[tuple[str, str]]  # title, markdown
    passages: dict[str, Passage]
    questions: list[tuple[str, str, str]]  # language, question, passage id


def load_eval(suffix: str = "") -> EvalSet:
    """The evaluation set in ``zh{suffix}.json`` and ``en{suffix}.json``: "" is the first one
    (set A), "_b" the held-out one written later (set B, see bench_retrieval_quality.py)."""
    data = EvalSet([], {}, [])
    for lang in ("zh", "en"):
        raw = json.loads((EVAL / f"{lang}{suffix}.json").read_text(encoding="utf-8"))
        for doc in raw["docs"]:
            text = f"# {doc['title']}\n\n"
            for p in doc["passages"]:
                text += f"## {p['heading']}\n\n"
                data.passages[p["id"]] = Passage(
                    doc["title"], len(text), len(text) + len(p["text"])
                )
                text += p["text"] + "\n\n"
            data.docs.append((doc["title"], text))
        data.questions += [(lang, q["q"], q["passage"]) for q in raw["questions"]]
    return data


def covers(hit: SearchHit, passage: Passage) -> bool:
    overlap = min(hit.end, passage.end) - max(hit.start, passage.start)
    shorter = min(hit.end - hit.start, passage.end - passage.start)
    return hit.title == passage.doc and overlap * 2 >= shorter


class Stack:
    def __init__(
        self,
        root: Path,
        backend: str,
        embedder: LoadedEmbedder,
        sparse: SparseEncoder | None = None,  # edge's BM25 unless given
    ) -> None:
        self.root, self.backend, self.embedder = root, backend, embedder
        self.sparse: SparseEncoder = sparse or EdgeBm25()

    async def open(self) -> None:
        url = f"sqlite+aiosqlite:///{self.root / 'db.sqlite'}"
        await anyio.to_thread.run_sync(upgrade, url)
        self.db_engine, self.sessions = create_db(url)
        if self.backend == "edge":  # the benchmark decides when to optimize
            self.vectors: Any = EdgeVectorStore(self.root / "vectors", 0, 0)
        else:
            self.vectors = QdrantVectorStore(AsyncQdrantClient(path=str(self.root / "qdrant")))
        await self.vectors.ensure(self.embedder.dimension)
        self.ingestor = Ingestor(
            self.sessions, self.vectors, self.embedder, IngestSettings(), sparse=self.sparse
        )
        self.retriever = Retriever(self.sessions, self.vectors, self.embedder, sparse=self.sparse)

    async def new_kb(self) -> str:
        async with self.sessions() as session:
            kb = KnowledgeBase(name=new_id())
            session.add(kb)
            await session.commit()
            return kb.id

    async def close(self) -> None:
        await self.vectors.close()
        await self.db_engine.dispose()


async def ingest(stack: Stack, kb: str, docs: list[tuple[str, str]]) -> int:
    chunks: list[int] = []
    async with stack.ingestor.batch(kb, lambda _, r: chunks.append(r.document.chunk_count)) as b:
        for title, text in docs:
            await b.add(DocumentDraft(title, parse_markdown(text), source=title))
    return sum(chunks)


async def quality(stack: Stack, kb: str, data: EvalSet) -> dict[str, Any]:
    ranks: dict[tuple[str, str], list[int]] = {}
    for lang, question, pid in data.questions:
        for mode in MODES:
            hits = await stack.retriever.search(kb, question, 5, mode=mode)
            rank = next((i + 1 for i, h in enumerate(hits) if covers(h, data.passages[pid])), 0)
            ranks.setdefault((lang, mode), []).append(rank)
    out: dict[str, Any] = {}
    for (lang, mode), rs in sorted(ranks.items()):
        out.setdefault(lang, {})[mode] = {
            "questions": len(rs),
            **{f"recall@{k}": round(sum(0 < r <= k for r in rs) / len(rs), 3) for k in (1, 3, 5)},
            "mrr": round(sum(1 / r for r in rs if r) / len(rs), 3),
        }
    return out


def vocabulary(data: EvalSet, rng: random.Random) -> list[str]:
    """English words and Chinese two-character words from the evaluation texts, and made-up
    words, so the filler's BM25 postings overlap the queries' terms as real text would."""
    words = {w.strip(".,:;`()").lower() for _, t in data.docs for w in t.split() if w.isascii()}
    han = "".join(c for _, t in data.docs for c in t if "\u4e00" <= c <= "\u9fff")
    words |= {han[i : i + 2] for i in range(0, len(han) - 1, 3)}
    letters = "abcdefghijklmnopqrstuvwxyz"
    words |= {"".join(rng.choices(letters, k=rng.randint(4, 9))) for _ in range(5000)}
    return sorted(w for w in words if w)


async def fill(stack: Stack, target: str, kbs: list[str], count: int, vocab: list[str]) -> None:
    """``count`` filler chunks over ``kbs`` (the target too), in SQL and in the store."""
    rng = random.Random(count)
    np_rng = np.random.default_rng(count)
    step = 2000
    for start in range(0, count, step):
        n = min(step, count - start)
        texts = [" ".join(rng.choices(vocab, k=60)) for _ in range(n)]
        dense = np_rng.standard_normal((n, stack.embedder.dimension)).astype(np.float32)
        dense /= np.linalg.norm(dense, axis=1, keepdims=True)
        terms = await anyio.to_thread.run_sync(stack.sparse.encode_documents, texts)
        rows, points, docs = [], [], []
        for i in range(n):
            kb = kbs[(start + i) % len(kbs)]
            if i % 100 == 0 or not docs or docs[-1]["kb_id"] != kb:
                docs.append({"id": new_id(), "kb_id": kb, "title": "filler", "text": "",
                             "content_hash": new_id(), "meta": {}})  # fmt: skip
            chunk_id = new_id()
            rows.append({"id": chunk_id, "document_id": docs[-1]["id"], "kb_id": kb, "ordinal": i,
                         "text": texts[i], "start": 0, "end": 0, "heading": None,
                         "token_count": 60})  # fmt: skip
            points.append(VectorPoint(chunk_id, dense[i], kb, docs[-1]["id"], {}, terms[i]))
        async with stack.sessions() as session:
            await session.execute(insert(Document), docs)
            await session.execute(insert(Chunk), rows)
            await session.commit()
        for i in range(0, n, 500):
            await stack.vectors.upsert(points[i : i + 500])


async def latency(
    stack: Stack, kb: str, questions: list[str], mode: SearchMode, n: int
) -> dict[str, Any]:
    """p50/p99 of Retriever.search end to end, and of its two parts measured alone: embedding
    the query, and the vector store's search (the same query, already encoded)."""
    for q in questions[:3]:
        await stack.retriever.search(kb, q, 5, mode=mode)
    full, embed, store = [], [], []
    for i in range(n):
        q = questions[i % len(questions)]
        began = time.perf_counter()
        await stack.retriever.search(kb, q, 5, mode=mode)
        full.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        dense = (await stack.embedder.embed([q]))[0]
        embed.append((time.perf_counter() - began) * 1000)
        query = VectorQuery(mode, dense, stack.sparse.encode_query(q) or None)
        if not query.sparse and mode != "dense":
            continue
        began = time.perf_counter()
        await stack.vectors.search(kb, query, 25)
        store.append((time.perf_counter() - began) * 1000)
    return {"search": _percentiles(full), "embed_query": _percentiles(embed),
            "store": _percentiles(store), "n": n}  # fmt: skip


def _percentiles(times: list[float]) -> dict[str, float]:
    p50, p99 = statistics.median(times), percentile(times, 0.99)
    return {"p50_ms": round(p50, 2), "p99_ms": round(p99, 2)}


def synthetic(n: int, vocab: list[str]) -> list[tuple[str, str]]:
    rng = random.Random(7)
    docs = []
    for d in range(n):
        parts = [f"# Document {d}"]
        for s in range(6):
            words = rng.choices([w for w in vocab if w.isascii()], k=rng.randint(60, 140))
            parts.append(f"## Section {s}\n\n" + " ".join(words) + ".")
        docs.append((f"doc {d}", "\n\n".join(parts) + "\n"))
    return docs


async def ingestion(embedder: LoadedEmbedder, vocab: list[str], reps: int) -> Any:
    docs = synthetic(24, vocab)
    ours: list[float] = []
    raw: list[float] = []
    for rep in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            stack = Stack(Path(tmp), "edge", embedder)
            await stack.open()
            texts = []  # the chunks ingestion will make, for the bare encode
            for _, text in docs:
                texts += [span.text for span in await stack.ingestor.chunk(parse_markdown(text))]
            for which in [0, 1] if rep % 2 == 0 else [1, 0]:
                began = time.perf_counter()
                if which == 0:
                    chunks = await ingest(stack, await stack.new_kb(), docs)
                    await stack.vectors.optimize()
                    ours.append(chunks / (time.perf_counter() - began))
                else:
                    embedder.encode_sync(texts)
                    raw.append(len(texts) / (time.perf_counter() - began))
            await stack.close()
    return {
        "chunks": len(texts),
        "ingest_chunks_per_s": [round(x, 1) for x in ours],
        "raw_encode_chunks_per_s": [round(x, 1) for x in raw],
        "ratio_of_medians": round(statistics.median(ours) / statistics.median(raw), 3),
    }


async def main(args: argparse.Namespace) -> None:
    settings = load_settings()
    embedder = await load_embedder(settings.resolved_embedder, backend=settings.embedder_backend)
    data = load_eval()
    vocab = vocabulary(data, random.Random(1))
    questions = [q for _, q, _ in data.questions]
    report: dict[str, Any] = {
        "command": command(),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "platform": platform.platform(), "load_before": os.getloadavg()},
        "embedder": Path(settings.resolved_embedder).name,
        "embedder_backend": embedder.backend,
        "eval": {"zh": sum(lang == "zh" for lang, _, _ in data.questions),
                 "en": sum(lang == "en" for lang, _, _ in data.questions)},
        "quality": {}, "latency": {},
    }  # fmt: skip
    for backend in args.backends:
        for size in args.sizes:
            if backend == "local" and size > args.local_max:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                stack = Stack(Path(tmp), backend, embedder)
                await stack.open()
                kbs = [await stack.new_kb() for _ in range(KBS)]
                real = await ingest(stack, kbs[0], data.docs)
                if backend not in report["quality"]:
                    await stack.vectors.optimize()
                    report["quality"][backend] = await quality(stack, kbs[0], data)
                    print(backend, json.dumps(report["quality"][backend]), flush=True)
                if args.quality_only:
                    await stack.close()
                    break
                began = time.perf_counter()
                await fill(stack, kbs[0], kbs, size - real, vocab)
                entry: dict[str, Any] = {"upload_s": round(time.perf_counter() - began, 1)}
                # local mode scans every point in Python: fewer queries at the larger sizes
                n = (
                    args.queries
                    if backend == "edge" or size <= 1000
                    else 20
                    if size <= 20000
                    else args.local_queries
                )
                if backend == "edge":
                    entry["right_after_upload"] = await latency(
                        stack, kbs[0], questions, "hybrid", n
                    )
                    began = time.perf_counter()
                    await stack.vectors.optimize()
                    entry["optimize_s"] = round(time.perf_counter() - began, 2)
                for mode in args.modes:
                    entry[mode] = await latency(stack, kbs[0], questions, mode, n)
                report["latency"].setdefault(backend, {})[str(size)] = entry
                print(backend, size, json.dumps(entry), flush=True)
                await stack.close()
    if args.quality_only:
        print(json.dumps(report["quality"], indent=1, ensure_ascii=False))
        return
    if args.reps:
        report["ingestion"] = await ingestion(embedder, vocab, args.reps)
        print("ingestion", json.dumps(report["ingestion"]), flush=True)
    report["machine"]["load_after"] = os.getloadavg()
    out = ROOT / "docs" / "bench" / args.out
    write_json(out, report)
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 20000, 200000])
    parser.add_argument("--local-max", type=int, default=200000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3, help="ingestion repetitions (0: none)")
    parser.add_argument("--backends", nargs="+", default=["edge", "local"])
    parser.add_argument("--modes", nargs="+", default=MODES, help="latency: which modes")
    parser.add_argument("--local-queries", type=int, default=5, help="local mode past 20k")
    parser.add_argument("--out", default="retrieval.json", help="file name in docs/bench/")
    parser.add_argument("--quality-only", action="store_true")
    asyncio.run(main(parser.parse_args()))
