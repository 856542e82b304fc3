"""Retriever.search on the real stores (both embedded backends), in each mode: ranking,
metadata filters, score threshold, MMR."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import pytest

from rag_stream.ingest.documents import DocumentDraft
from rag_stream.ingest.parsing import parse_markdown, parse_plain
from rag_stream.retrieval.retriever import Retriever
from rag_stream.retrieval.vector_store import VectorHit, VectorQuery
from rag_stream.schemas.kbs import SearchMode
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.store.models import Document
from tests.support.hooked_vectors import HookedVectorStore

# The fixtures come from tests/support/kb_stack.py; test arguments reuse their names.
# ruff: noqa: F811
from tests.support.kb_stack import (  # noqa: F401
    Stack,
    backend,
    db_url,
    embedder,
    stack,
)

SOLAR = "# Solar\n\n" + "\n\n".join(
    f"## Part {i}\n\nSolar panels convert sunlight into electricity; panel efficiency drops as "
    f"the panels get hot, so solar panel output is highest on cold sunny days. Part {i}."
    for i in range(6)
)
OTHERS = {
    "Rooftop modules": "Photovoltaic modules on rooftops produce less power in summer heat; "
    "cooling improves their yield.",
    "Wind": "Wind turbines produce electricity from moving air and work best on exposed hills.",
    "Batteries": "Batteries store solar electricity for the evening; lithium iron phosphate "
    "cells last longest.",
}
QUERY = "how does heat affect solar panel efficiency"
MODES: list[SearchMode] = ["hybrid", "dense", "sparse"]


async def _energy_kb(stack: Stack) -> str:
    kb = await stack.new_kb()
    await stack.ingestor.ingest(
        kb,
        DocumentDraft("Solar", parse_markdown(SOLAR), meta={"topic": "solar", "year": 2024}),
        tenant=LOCAL_TENANT,
    )
    for title, text in OTHERS.items():
        meta = {"topic": title.lower(), "year": 2023}
        await stack.ingestor.ingest(
            kb, DocumentDraft(title, parse_plain(text), meta=meta), tenant=LOCAL_TENANT
        )
    return kb


@pytest.mark.parametrize("mode", MODES)
async def test_results_are_ranked_and_carry_citations(stack: Stack, mode: SearchMode) -> None:
    kb = await _energy_kb(stack)
    hits = await stack.retriever.search(kb, "wind turbines on hills", 3, mode=mode)
    assert hits[0].title == "Wind"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    async with stack.sessions() as session:
        for hit in hits:
            doc = await session.get(Document, hit.document_id)
            assert doc is not None and doc.text[hit.start : hit.end] == hit.text
    solar = await stack.retriever.search(kb, QUERY, 2, mode=mode)
    if mode == "dense":
        assert solar[0].title == "Solar" and solar[0].heading is not None
        assert solar[0].heading.startswith("Part")
    else:  # "heat" is only in the rooftop note (about the same thing): it may come first
        assert solar[0].title in {"Solar", "Rooftop modules"}
        assert "Solar" in {h.title for h in solar}


@pytest.mark.parametrize("mode", MODES)
async def test_metadata_filter_and_score_threshold(stack: Stack, mode: SearchMode) -> None:
    kb = await _energy_kb(stack)
    search = partial(stack.retriever.search, kb, QUERY, mode=mode)
    only_2023 = await search(5, meta_filter={"year": 2023})
    assert only_2023 and {h.title for h in only_2023} <= set(OTHERS)
    picked = await search(5, meta_filter={"topic": ["wind", "batteries"]})
    # keyword search finds only chunks sharing a term with the query ("solar" batteries)
    assert {h.title for h in picked} == (
        {"Batteries"} if mode == "sparse" else {"Wind", "Batteries"}
    )
    # the threshold is on cosine similarity in every mode: what passes is what dense passes
    dense_strict = await stack.retriever.search(kb, QUERY, 10, score_threshold=0.5, mode="dense")
    assert dense_strict and all(h.score >= 0.5 for h in dense_strict)
    strict = await search(10, score_threshold=0.5)
    assert strict and {h.chunk_id for h in strict} <= {h.chunk_id for h in dense_strict}
    assert await search(5, score_threshold=0.99) == []
    # another knowledge base never leaks in
    other = await stack.new_kb()
    assert await stack.retriever.search(other, QUERY, 5, mode=mode) == []


async def test_mmr_spreads_the_top_results_over_documents(stack: Stack) -> None:
    kb = await _energy_kb(stack)
    plain = await stack.retriever.search(kb, QUERY, 4, mode="dense")
    assert {h.title for h in plain} == {"Solar"}  # four near-identical parts of one page
    diverse = await stack.retriever.search(kb, QUERY, 4, mmr=True, mode="dense")
    assert diverse[0].chunk_id == plain[0].chunk_id
    assert len({h.document_id for h in diverse}) >= 3
    assert diverse[1].title == "Rooftop modules"


async def test_mmr_on_hybrid_results_keeps_the_best_and_spreads_the_rest(stack: Stack) -> None:
    kb = await _energy_kb(stack)
    plain = await stack.retriever.search(kb, QUERY, 4)
    assert sum(h.title == "Solar" for h in plain) >= 3
    diverse = await stack.retriever.search(kb, QUERY, 4, mmr=True)
    assert diverse[0].chunk_id == plain[0].chunk_id
    assert len({h.document_id for h in diverse}) >= 3


class _TiedStore(HookedVectorStore):
    """The real store's hits, every score made equal and their order reversed: the worst case
    of the ties hybrid search produces, which the store returns in no fixed order."""

    async def search(
        self,
        kb_id: str,
        query: VectorQuery,
        limit: int,
        meta_filter: Mapping[str, Any] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        hits = await super().search(kb_id, query, limit, meta_filter, score_threshold, with_vectors)
        return [replace(h, score=0.5) for h in reversed(hits)]


@pytest.mark.parametrize("mode", MODES)
async def test_equal_scores_come_in_one_order_with_or_without_mmr(
    stack: Stack, mode: SearchMode
) -> None:
    kb = await _energy_kb(stack)
    tied = Retriever(stack.sessions, _TiedStore(stack.vectors), stack.embedder, sparse=stack.sparse)
    hits = await tied.search(kb, QUERY, 5, mode=mode)
    assert len(hits) == 5
    assert [h.chunk_id for h in hits] == sorted(h.chunk_id for h in hits)
    # MMR starts from the same best hit (with vectors, the store's order had differed)
    diverse = await tied.search(kb, QUERY, 5, mode=mode, mmr=True)
    assert diverse[0].chunk_id == hits[0].chunk_id
