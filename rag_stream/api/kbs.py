"""/v1/kbs: create, list, read and delete knowledge bases."""

from __future__ import annotations

from fastapi import APIRouter, Response

from rag_stream.api.deps import IngestorDep, SessionDep, TenantDep
from rag_stream.api.documents import document_out
from rag_stream.api.openapi import errors
from rag_stream.schemas.kbs import ChunkDetail, DocumentOut, KbCreate, KbList, KbOut
from rag_stream.store import repositories as repo
from rag_stream.store.repositories import KbStats

router = APIRouter(prefix="/v1/kbs", tags=["knowledge bases"])


def kb_out(stats: KbStats) -> KbOut:
    kb = stats.kb
    return KbOut(
        id=kb.id,
        name=kb.name,
        description=kb.description,
        created_at=kb.created_at,
        document_count=stats.document_count,
        chunk_count=stats.chunk_count,
    )


@router.post("", status_code=201, responses=errors(409))
async def create_kb(body: KbCreate, session: SessionDep, tenant: TenantDep) -> KbOut:
    kb = await repo.create_kb(session, body.name, body.description, tenant=tenant)
    return kb_out(KbStats(kb, 0, 0))


@router.get("")
async def list_kbs(session: SessionDep, tenant: TenantDep) -> KbList:
    return KbList(data=[kb_out(s) for s in await repo.list_kbs(session, tenant=tenant)])


@router.get("/{kb}")
async def get_kb(kb: str, session: SessionDep, tenant: TenantDep) -> KbOut:
    found = await repo.resolve_kb(session, kb, tenant=tenant)
    (stats,) = await repo.kb_stats(session, [found])
    return kb_out(stats)


@router.get("/{kb}/chunks/{chunk_id}")
async def get_chunk(kb: str, chunk_id: str, session: SessionDep, tenant: TenantDep) -> ChunkDetail:
    """One chunk and its document: where a chat completion's citation URLs point."""
    found = await repo.resolve_kb(session, kb, tenant=tenant)
    chunk, doc = await repo.get_chunk(session, found.id, chunk_id)
    return ChunkDetail(
        id=chunk.id,
        kb_id=found.id,
        ordinal=chunk.ordinal,
        start=chunk.start,
        end=chunk.end,
        heading=chunk.heading,
        token_count=chunk.token_count,
        text=chunk.text,
        document=DocumentOut(**document_out(doc)),
    )


@router.delete("/{kb}", status_code=204)
async def delete_kb(kb: str, ingestor: IngestorDep, tenant: TenantDep) -> Response:
    await ingestor.delete_kb(kb, tenant=tenant)
    return Response(status_code=204)
