"""Ingestion against the real stores: SQLite and PostgreSQL, Qdrant local, sentence-transformers.

Every test runs twice, once per database.
"""

from __future__ import annotations

import asyncio

import pytest

from rag_stream.errors import InvalidRequest, NotFound
from rag_stream.ingest.documents import DocumentDraft
from rag_stream.ingest.parsing import parse_markdown, parse_plain
from rag_stream.ingest.writer import IngestResult
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.store import repositories as repo
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

GUIDE = """# Garden guide

Tomatoes need at least six hours of direct sun every day. Water them deeply twice a week rather
than a little every day, so the roots grow down into the soil.

## Pests

Aphids gather on the underside of young leaves. A strong jet of water knocks them off, and
ladybirds eat them by the hundred. Slugs come out at night after rain; copper tape around the
pots keeps them away from seedlings.

## Harvest

Pick tomatoes when they are fully coloured but still firm. They keep for a week at room
temperature; the fridge spoils their flavour.
"""

BIKES = """Chain care for bicycles.

Clean the chain with a rag and degreaser every few hundred kilometres, then apply one drop of
lubricant per roller and wipe off the excess. A dry chain squeaks and wears the cassette.

Tyre pressure matters more than most riders think: road tyres want six to eight bar, while
mountain bike tyres run between one and a half and two bar depending on the rider's weight.
"""


def draft(
    text: str, title: str = "doc", source: str | None = None, **meta: object
) -> DocumentDraft:
    parsed = parse_markdown(text) if text.lstrip().startswith("#") else parse_plain(text)
    return DocumentDraft(title, parsed, source, meta)


async def injected_fault() -> None:
    raise RuntimeError("injected fault after the vector upsert")


async def test_chunks_carry_what_a_citation_needs(stack: Stack) -> None:
    kb = await stack.new_kb()
    result = await stack.ingestor.ingest(
        kb, draft(GUIDE, "Garden guide", "garden.md"), tenant=LOCAL_TENANT
    )
    assert result.created
    doc = result.document
    async with stack.sessions() as session:
        chunks = await repo.chunks_of(session, doc.id)
    assert len(chunks) == doc.chunk_count >= 3
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert chunk.document_id == doc.id
        assert doc.text[chunk.start : chunk.end] == chunk.text
        assert 0 < chunk.token_count <= stack.ingestor.max_tokens
    pests = next(c for c in chunks if "Aphids" in c.text)
    assert pests.heading == "Pests"
    assert next(c for c in chunks if "fridge" in c.text).heading == "Harvest"
    # one point per chunk, with the chunk id as the point id
    assert await stack.point_ids(kb) == {c.id for c in chunks}


async def test_same_content_twice_creates_nothing_new(stack: Stack) -> None:
    kb = await stack.new_kb()
    first = await stack.ingestor.ingest(kb, draft(BIKES, "Bikes"), tenant=LOCAL_TENANT)
    points = await stack.point_ids(kb)
    again = await stack.ingestor.ingest(
        kb, draft(BIKES, "Another title", "elsewhere.txt"), tenant=LOCAL_TENANT
    )
    assert not again.created
    assert again.document.id == first.document.id
    assert await stack.row_counts(kb) == (1, first.document.chunk_count)
    assert await stack.point_ids(kb) == points


async def test_reupload_of_a_source_replaces_the_old_version(stack: Stack) -> None:
    kb = await stack.new_kb()
    old = await stack.ingestor.ingest(kb, draft(BIKES, "Bikes", "bikes.txt"), tenant=LOCAL_TENANT)
    edited = BIKES.replace("six to eight bar", "five to seven bar")
    new = await stack.ingestor.ingest(kb, draft(edited, "Bikes", "bikes.txt"), tenant=LOCAL_TENANT)
    assert new.created and new.replaced_id == old.document.id
    assert new.document.id != old.document.id
    assert await stack.row_counts(kb) == (1, new.document.chunk_count)
    assert await stack.point_ids(kb) == await stack.chunk_row_ids(kb)
    hits = await stack.retriever.search(kb, "tyre pressure for road bikes", 3)
    assert hits and all(h.document_id == new.document.id for h in hits)
    assert any("five to seven bar" in h.text for h in hits)


async def test_a_fault_between_vector_upsert_and_commit_leaves_nothing(stack: Stack) -> None:
    kb = await stack.new_kb()
    failing = stack.another_ingestor(HookedVectorStore(stack.vectors, after_upsert=injected_fault))
    with pytest.raises(RuntimeError, match="injected fault"):
        await failing.ingest(kb, draft(GUIDE, "Garden", "garden.md"), tenant=LOCAL_TENANT)
    assert await stack.row_counts(kb) == (0, 0)
    assert await stack.point_count(kb) == 0

    # A failed replacement keeps the old version whole and searchable.
    old = await stack.ingestor.ingest(kb, draft(BIKES, "Bikes", "bikes.txt"), tenant=LOCAL_TENANT)
    before = await stack.point_ids(kb)
    with pytest.raises(RuntimeError, match="injected fault"):
        await failing.ingest(
            kb, draft(BIKES + "\nAlso oil the pedals.", "Bikes", "bikes.txt"), tenant=LOCAL_TENANT
        )
    assert await stack.row_counts(kb) == (1, old.document.chunk_count)
    assert await stack.point_ids(kb) == before == await stack.chunk_row_ids(kb)
    hits = await stack.retriever.search(kb, "how to clean a bicycle chain", 2)
    assert hits[0].document_id == old.document.id


async def test_an_upload_that_loses_the_race_by_a_whole_commit_stores_nothing(
    stack: Stack,
) -> None:
    """B is prepared (no such content yet), then A stores the same document completely, then B
    commits: B finds A's version under the same source and stands down (it used to replace it,
    and both reported created)."""
    b_waiting, a_done = asyncio.Event(), asyncio.Event()

    async def wait_for_a() -> None:
        b_waiting.set()
        await a_done.wait()

    kb = await stack.new_kb()
    b = stack.another_ingestor(HookedVectorStore(stack.vectors, after_upsert=wait_for_a))
    b_task = asyncio.create_task(
        b.ingest(kb, draft(GUIDE, "Garden", "garden.md"), tenant=LOCAL_TENANT)
    )
    await asyncio.wait_for(b_waiting.wait(), 60)  # B is past its checks, after its upsert
    a = await stack.ingestor.ingest(kb, draft(GUIDE, "Garden", "garden.md"), tenant=LOCAL_TENANT)
    a_done.set()
    b_result = await b_task
    assert a.created and not b_result.created
    assert b_result.document.id == a.document.id


async def test_concurrent_uploads_of_one_document_store_it_once(stack: Stack) -> None:
    """Two ingestors with separate locks (like two processes) race to the commit: the unique
    constraint picks one, the other returns that document and removes its own vectors."""
    barrier = asyncio.Barrier(2)
    met: list[int] = []

    async def meet() -> None:
        met.append(await barrier.wait())  # both have upserted their vectors before either commits

    kb = await stack.new_kb()
    a = stack.another_ingestor(HookedVectorStore(stack.vectors, after_upsert=meet))
    b = stack.another_ingestor(HookedVectorStore(stack.vectors, after_upsert=meet))
    results = await asyncio.gather(
        a.ingest(kb, draft(GUIDE, "Garden", "garden.md"), tenant=LOCAL_TENANT),
        b.ingest(kb, draft(GUIDE, "Garden", "garden.md"), tenant=LOCAL_TENANT),
    )
    assert sorted(met) == [0, 1]
    assert sorted(r.created for r in results) == [False, True]
    assert results[0].document.id == results[1].document.id
    assert await stack.row_counts(kb) == (1, results[0].document.chunk_count)
    assert await stack.point_ids(kb) == await stack.chunk_row_ids(kb)


async def test_concurrent_uploads_in_one_process_embed_once(stack: Stack) -> None:
    kb = await stack.new_kb()
    results = await asyncio.gather(
        *(stack.ingestor.ingest(kb, draft(BIKES, "Bikes"), tenant=LOCAL_TENANT) for _ in range(4))
    )
    assert sum(r.created for r in results) == 1
    assert len({r.document.id for r in results}) == 1
    assert await stack.point_ids(kb) == await stack.chunk_row_ids(kb)


async def test_search_sees_exactly_one_version_while_a_document_is_replaced(
    stack: Stack,
) -> None:
    """Look at the two moments in between: new vectors written but not committed, and
    committed but the old vectors not yet deleted."""
    kb = await stack.new_kb()
    old = await stack.ingestor.ingest(kb, draft(BIKES, "Bikes", "bikes.txt"), tenant=LOCAL_TENANT)
    seen: dict[str, set[str]] = {}

    async def versions_found(moment: str) -> None:
        hits = await stack.retriever.search(kb, "bicycle chain lubricant and tyre pressure", 5)
        seen[moment] = {h.document_id for h in hits}

    async def before_commit() -> None:
        await versions_found("before commit")

    async def after_commit() -> None:  # the old version's vectors are deleted after the commit
        await versions_found("after commit")

    watched = stack.another_ingestor(
        HookedVectorStore(
            stack.vectors, after_upsert=before_commit, before_delete_chunks=after_commit
        )
    )
    new = await watched.ingest(
        kb, draft(BIKES + "\nWax works too.", "Bikes", "bikes.txt"), tenant=LOCAL_TENANT
    )
    assert seen == {"before commit": {old.document.id}, "after commit": {new.document.id}}


async def test_deleting_a_document_removes_its_rows_and_vectors(stack: Stack) -> None:
    kb = await stack.new_kb()
    keep = await stack.ingestor.ingest(kb, draft(BIKES, "Bikes"), tenant=LOCAL_TENANT)
    gone = await stack.ingestor.ingest(kb, draft(GUIDE, "Garden"), tenant=LOCAL_TENANT)
    await stack.ingestor.delete_document(kb, gone.document.id, tenant=LOCAL_TENANT)
    assert await stack.row_counts(kb) == (1, keep.document.chunk_count)
    assert await stack.point_ids(kb) == await stack.chunk_row_ids(kb)
    with pytest.raises(NotFound):
        await stack.ingestor.delete_document(kb, gone.document.id, tenant=LOCAL_TENANT)


async def test_deleting_a_kb_removes_its_documents_chunks_and_vectors(stack: Stack) -> None:
    kb, other = await stack.new_kb(), await stack.new_kb()
    await stack.ingestor.ingest(kb, draft(BIKES, "Bikes"), tenant=LOCAL_TENANT)
    kept = await stack.ingestor.ingest(other, draft(BIKES, "Bikes"), tenant=LOCAL_TENANT)
    await stack.ingestor.delete_kb(kb, tenant=LOCAL_TENANT)
    assert await stack.row_counts(kb) == (0, 0)
    assert await stack.point_count(kb) == 0
    assert await stack.row_counts(other) == (1, kept.document.chunk_count)
    assert await stack.point_count(other) == kept.document.chunk_count
    async with stack.sessions() as session:
        with pytest.raises(NotFound):
            await repo.resolve_kb(session, kb, tenant=LOCAL_TENANT)


async def test_a_kb_can_be_named_by_its_name(stack: Stack) -> None:
    kb = await stack.new_kb("garden-notes")
    result = await stack.ingestor.ingest(
        "garden-notes", draft(GUIDE, "Garden"), tenant=LOCAL_TENANT
    )
    assert result.document.kb_id == kb
    await stack.ingestor.delete_document("garden-notes", result.document.id, tenant=LOCAL_TENANT)
    assert await stack.row_counts(kb) == (0, 0)
    await stack.ingestor.delete_kb("garden-notes", tenant=LOCAL_TENANT)
    with pytest.raises(NotFound):
        await stack.ingestor.resolve_kb(kb, tenant=LOCAL_TENANT)


async def test_rejects_empty_text_and_unknown_kb(stack: Stack) -> None:
    kb = await stack.new_kb()
    with pytest.raises(InvalidRequest, match="empty"):
        await stack.ingestor.ingest(kb, draft(" \n\t "), tenant=LOCAL_TENANT)
    with pytest.raises(NotFound):
        await stack.ingestor.ingest("0" * 32, draft(BIKES), tenant=LOCAL_TENANT)
    assert await stack.point_count(kb) == 0


async def test_a_batch_commits_each_document_and_reports_each_outcome(stack: Stack) -> None:
    kb = await stack.new_kb()
    outcomes: dict[str, object] = {}
    async with stack.ingestor.batch(kb, outcomes.__setitem__) as batch:
        await batch.add(draft(GUIDE, "Garden", "garden.md"), "garden")
        await batch.add(draft(BIKES, "Bikes", "bikes.txt"), "bikes")
        await batch.add(draft(BIKES, "Bikes again", "copy.txt"), "copy")  # same content
        await batch.add(draft("   "), "blank")
    garden, bikes, copy = outcomes["garden"], outcomes["bikes"], outcomes["copy"]
    assert isinstance(garden, IngestResult) and garden.created
    assert isinstance(bikes, IngestResult) and bikes.created
    assert isinstance(copy, IngestResult) and not copy.created
    assert copy.document.id == bikes.document.id
    assert isinstance(outcomes["blank"], InvalidRequest)
    total = garden.document.chunk_count + bikes.document.chunk_count
    assert await stack.row_counts(kb) == (2, total)
    assert await stack.point_ids(kb) == await stack.chunk_row_ids(kb)


async def test_a_fault_inside_a_batch_leaves_no_orphans(stack: Stack) -> None:
    kb = await stack.new_kb()
    failing = stack.another_ingestor(HookedVectorStore(stack.vectors, after_upsert=injected_fault))
    with pytest.raises(RuntimeError, match="injected fault"):
        async with failing.batch(kb) as batch:
            await batch.add(draft(GUIDE, "Garden"))
            await batch.add(draft(BIKES, "Bikes"))
    assert await stack.row_counts(kb) == (0, 0)
    assert await stack.point_count(kb) == 0
