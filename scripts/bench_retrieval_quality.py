"""Retrieval quality on two evaluation sets: the RRF constant chosen on one and tested on the
other, and qdrant-edge's BM25 against jieba + BM25 weights computed here (jieba_bm25.py).

Sets (scripts/data/retrieval_eval/): A is ``zh.json`` + ``en.json`` (the one the shipped
RRF_K = 2 was tuned on), B is ``zh_b.json`` + ``en_b.json`` (written afterwards, on other
topics, never used for tuning before this). Each set is ingested into its own knowledge base
through the real path (chunking, embedding, BM25, SQL, edge store), once per sparse encoder.
Every question is searched with ``Retriever.search`` in dense and in sparse mode (top 50: the
lists the store's hybrid query fuses, whose prefetch depth is 50 for a top 5), and in hybrid
mode (top 5, the store's fusion at the shipped RRF_K). Hybrid for each k is then fused here
from the two lists exactly as Qdrant does (``1 / (k + position)``, position from 0: Qdrant's
k is the paper's k + 1; lib/segment/src/common/reciprocal_rank_fusion.rs). Qdrant leaves ties
in no particular order (a chunk first in one list and another first in the other tie at any
k), so each fused figure is the mean over ``--tie-orders`` random tie orders. A hit counts as
in bench_retrieval.py; ranks are over the top 5.

Choosing k on a set: the k with the best mean of Chinese and English hybrid MRR (ties: the
larger k).

Encoder speed: every chunk of both sets through ``encode_documents`` (``--speed-reps`` times,
median chunks/s by language) and every question through ``encode_query`` (median and p99).

    nice -n 10 .venv/bin/python scripts/bench_retrieval_quality.py

Raw results go to docs/bench/retrieval-quality.json; the tables are printed as markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_retrieval import ROOT, EvalSet, Stack, covers, ingest, load_eval
from jieba_bm25 import JiebaBm25

from rag_stream.ingest.parsing import parse_markdown
from rag_stream.retrieval.edge_bm25 import EdgeBm25
from rag_stream.retrieval.embedder import LoadedEmbedder, load_embedder
from rag_stream.retrieval.sparse import SparseEncoder
from rag_stream.retrieval.vector_store import RRF_K
from rag_stream.settings import load_settings
from scripts.benchkit import command, percentile, write_json  # bench_retrieval: ROOT on the path

KS = [1, 2, 5, 10, 60]
SETS = {"A": "", "B": "_b"}
LANGS = ("zh", "en")
DEPTH = 50  # the store's prefetch depth for a top 5 (2 x the Retriever's 3 x 5 + 10)
METRICS = ("recall@1", "recall@3", "recall@5", "mrr")


@dataclass
class Lists:
    """One question's results: chunk ids best first, and which chunks hold the passage."""

    lang: str
    dense: list[str]
    sparse: list[str]
    hits: set[str]
    store_hybrid: int  # the labelled passage's rank in the store's own hybrid top 5 (0: none)


def rank(order: list[str], hits: set[str]) -> int:
    return next((i + 1 for i, c in enumerate(order[:5]) if c in hits), 0)


def metrics(ranks: list[int]) -> dict[str, float]:
    n = len(ranks)
    out = {f"recall@{k}": sum(0 < r <= k for r in ranks) / n for k in (1, 3, 5)}
    out["mrr"] = sum(1 / r for r in ranks if r) / n
    return out


def fused(q: Lists, k: int, rng: random.Random) -> list[str]:
    score: dict[str, float] = {}
    for ranking in (q.dense, q.sparse):
        for position, chunk in enumerate(ranking):
            score[chunk] = score.get(chunk, 0.0) + 1 / (k + position)
    chunks = list(score)
    rng.shuffle(chunks)  # then a stable sort: ties in a random order
    return sorted(chunks, key=lambda c: -score[c])


async def collect(
    embedder: LoadedEmbedder, sparse: SparseEncoder, sets: dict[str, EvalSet]
) -> dict[str, list[Lists]]:
    out: dict[str, list[Lists]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp), "edge", embedder, sparse)
        await stack.open()
        try:
            for name, data in sets.items():
                kb = await stack.new_kb()
                await ingest(stack, kb, data.docs)
                await stack.vectors.optimize()
                for lang, question, pid in data.questions:
                    search = stack.retriever.search
                    dense = await search(kb, question, DEPTH, mode="dense")
                    bm25 = await search(kb, question, DEPTH, mode="sparse")
                    hybrid = await search(kb, question, 5, mode="hybrid")
                    passage = data.passages[pid]
                    hits = {h.chunk_id for h in [*dense, *bm25, *hybrid] if covers(h, passage)}
                    store = rank([h.chunk_id for h in hybrid], hits)
                    out.setdefault(name, []).append(
                        Lists(
                            lang,
                            [h.chunk_id for h in dense],
                            [h.chunk_id for h in bm25],
                            hits,
                            store,
                        )
                    )
        finally:
            await stack.close()
    return out


def summarize(lists: dict[str, list[Lists]], tie_orders: int) -> dict[str, dict[str, Any]]:
    """ "set/lang/mode" (mode: dense, sparse, store_hybrid or hybrid_k<k>) -> metrics."""
    out: dict[str, dict[str, Any]] = {}
    rng = random.Random(0)
    for name, questions in lists.items():
        for lang in LANGS:
            qs = [q for q in questions if q.lang == lang]
            rows = {
                "dense": metrics([rank(q.dense, q.hits) for q in qs]),
                "sparse": metrics([rank(q.sparse, q.hits) for q in qs]),
                "store_hybrid": metrics([q.store_hybrid for q in qs]),
            }
            for k in KS:
                each = [metrics([rank(fused(q, k, rng), q.hits) for q in qs])
                        for _ in range(tie_orders)]  # fmt: skip
                rows[f"hybrid_k{k}"] = {m: statistics.mean(e[m] for e in each) for m in METRICS}
            for mode, row in rows.items():
                out[f"{name}/{lang}/{mode}"] = {"questions": len(qs)} | {
                    m: round(v, 3) for m, v in row.items()
                }
    return out


def choose_k(summary: dict[str, dict[str, Any]], tune: str) -> int:
    def score(k: int) -> tuple[float, int]:
        mrr = statistics.mean(summary[f"{tune}/{lang}/hybrid_k{k}"]["mrr"] for lang in LANGS)
        return round(mrr, 6), k

    return max(KS, key=score)


async def chunk_texts(embedder: LoadedEmbedder, docs: list[tuple[str, str]]) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp), "edge", embedder)
        await stack.open()
        texts = []
        for _, text in docs:
            texts += [span.text for span in await stack.ingestor.chunk(parse_markdown(text))]
        await stack.close()
    return texts


def speed(
    encoder: SparseEncoder, chunks: dict[str, list[str]], sets: dict[str, EvalSet], reps: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for lang in LANGS:
        texts = chunks[lang]
        encoder.encode_documents(texts)  # warm (jieba's dictionary, the stop-word cache)
        rates, cpu_rates = [], []
        for _ in range(reps):
            began, cpu = time.perf_counter(), time.process_time()
            encoder.encode_documents(texts)
            rates.append(len(texts) / (time.perf_counter() - began))
            cpu_rates.append(len(texts) / max(1e-9, time.process_time() - cpu))
        questions = [q for data in sets.values() for lg, q, _ in data.questions if lg == lang]
        times = []
        for _ in range(reps):
            for q in questions:
                began = time.perf_counter()
                encoder.encode_query(q)
                times.append((time.perf_counter() - began) * 1e6)
        out[lang] = {
            "chunks": len(texts),
            "chunks_per_s": round(statistics.median(rates)),
            "chunks_per_s_all": [round(r) for r in rates],
            "chunks_per_cpu_s": round(statistics.median(cpu_rates)),  # less hit by the load
            "query_us_p50": round(statistics.median(times), 1),
            "query_us_p99": round(percentile(times, 0.99), 1),
        }
    return out


def table(summary: dict[str, dict[str, Any]], name: str) -> str:
    rows = ["| mode | Chinese r@1 / r@3 / r@5 / MRR | English r@1 / r@3 / r@5 / MRR |",
            "|---|---|---|"]  # fmt: skip
    for mode in ["dense", "sparse", *(f"hybrid_k{k}" for k in KS), "store_hybrid"]:
        cells = []
        for lang in LANGS:
            m = summary[f"{name}/{lang}/{mode}"]
            cells.append(" / ".join(f"{m[x]:.2f}" for x in METRICS))
        rows.append(f"| {mode} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


def _lang(markdown: str) -> str:
    return "zh" if any("\u4e00" <= c <= "\u9fff" for c in markdown) else "en"


async def main(args: argparse.Namespace) -> None:
    settings = load_settings()
    embedder = await load_embedder(settings.resolved_embedder)
    sets = {name: load_eval(suffix) for name, suffix in SETS.items()}
    docs = [d for data in sets.values() for d in data.docs]
    chunks = {lang: await chunk_texts(embedder, [d for d in docs if _lang(d[1]) == lang])
              for lang in LANGS}  # fmt: skip
    probe = JiebaBm25(avg_len=1.0)
    avg_len = statistics.mean(len(probe.terms(t)) for t in chunks["zh"] + chunks["en"])
    encoders: dict[str, SparseEncoder] = {
        "edge": EdgeBm25(),
        "jieba-search": JiebaBm25(avg_len, "search"),
        "jieba-precise": JiebaBm25(avg_len, "precise"),
    }
    report: dict[str, Any] = {
        "command": command(),
        "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "embedder": Path(settings.resolved_embedder).name,
        "questions": {
            n: {lang: sum(q[0] == lang for q in d.questions) for lang in LANGS}
            for n, d in sets.items()
        },
        "shipped_rrf_k": RRF_K,
        "tie_orders": args.tie_orders,
        "jieba_avg_len": round(avg_len, 1),
        "quality": {},
        "speed": {},
    }
    for name in [] if args.speed_only else args.encoders:
        lists = await collect(embedder, encoders[name], sets)
        report["quality"][name] = summarize(lists, args.tie_orders)
        print(name, "quality done", flush=True)
    if "edge" in report["quality"]:
        edge = report["quality"]["edge"]
        report["rrf"] = {}
        for tune, test in (("A", "B"), ("B", "A")):
            k = choose_k(edge, tune)
            report["rrf"][f"tune_{tune}_test_{test}"] = {
                "chosen_k": k,
                "test": {lang: edge[f"{test}/{lang}/hybrid_k{k}"] for lang in LANGS},
            }
    for name in args.encoders:
        report["speed"][name] = speed(encoders[name], chunks, sets, args.speed_reps)
        print(name, "speed", json.dumps(report["speed"][name]), flush=True)
    report["machine"]["load_after"] = os.getloadavg()
    out = ROOT / "docs" / "bench" / args.out
    write_json(out, report, indent=1)
    for name in report["quality"]:
        for s in SETS:
            print(f"\n{name}, set {s}\n" + table(report["quality"][name], s))
    print(json.dumps(report.get("rrf"), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tie-orders", type=int, default=50)
    parser.add_argument("--speed-reps", type=int, default=5)
    parser.add_argument("--encoders", nargs="+", default=["edge", "jieba-search", "jieba-precise"])
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--out", default="retrieval-quality.json", help="file name in docs/bench/")
    asyncio.run(main(parser.parse_args()))
