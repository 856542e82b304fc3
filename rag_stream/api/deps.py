"""Request dependencies: everything comes from ``app.state.resources``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession

from rag_stream.ingest.service import Ingestor
from rag_stream.resources import Resources
from rag_stream.retrieval.retriever import Retriever
from rag_stream.settings import Settings
from rag_stream.store.db import unavailable
from rag_stream.store.keys import KeyOwner
from rag_stream.streaming.service import Streams
from rag_stream.streaming.start_keys import HEADER, MAX_CHARS, StartKey

# The dependencies are coroutines even where they do not wait: FastAPI runs a plain function
# in its thread pool, a hand-off to a worker thread and back on every request.


async def get_resources(request: Request) -> Resources:
    resources: Resources = request.app.state.resources
    return resources


ResourcesDep = Annotated[Resources, Depends(get_resources)]


async def get_settings(resources: ResourcesDep) -> Settings:
    return resources.settings


async def get_streams(resources: ResourcesDep) -> Streams:
    return resources.streams


async def get_ingestor(resources: ResourcesDep) -> Ingestor:
    return resources.ingestor


async def get_retriever(resources: ResourcesDep) -> Retriever:
    return resources.retriever


async def get_session(resources: ResourcesDep) -> AsyncIterator[AsyncSession]:
    """A session for a route that only reads; streams and services open their own."""
    session = resources.sessions()
    try:
        yield session
    finally:
        try:
            await session.close()
        except Exception as exc:
            # closing rolls back; on a connection the database dropped meanwhile (a restart)
            # that raised after the response, as "Exception in ASGI application"
            if unavailable(exc) is None:
                raise


_bearer = HTTPBearer(auto_error=False, description="an API key from `rag-stream keys create`")


BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_caller(resources: ResourcesDep, credentials: BearerDep) -> KeyOwner:
    """The caller's key and tenant (401 without a valid key once keys are required), counted
    against its per-minute limit (429 past it)."""
    try:
        owner = await resources.keys.owner(credentials.credentials if credentials else None)
    except Exception as exc:
        # raised as is, the generic handler answered 503 but Starlette re-raised the error
        # after the response ("Exception in ASGI application"); a service error ends there
        if (db := unavailable(exc)) is None:
            raise
        raise db from exc
    await resources.quotas.count_request(owner.key_id)
    return owner


async def get_tenant(caller: Annotated[KeyOwner, Depends(get_caller)]) -> str:
    return caller.tenant


SettingsDep = Annotated[Settings, Depends(get_settings)]
StreamsDep = Annotated[Streams, Depends(get_streams)]
IngestorDep = Annotated[Ingestor, Depends(get_ingestor)]
RetrieverDep = Annotated[Retriever, Depends(get_retriever)]
SessionDep = Annotated[AsyncSession, Depends(get_session)]
CallerDep = Annotated[KeyOwner, Depends(get_caller)]
# The tenant every id a route reads or writes must belong to (another tenant's: 404).
TenantDep = Annotated[str, Depends(get_tenant)]


async def get_start_key(
    request: Request,
    key: Annotated[
        str | None,
        Header(
            alias=HEADER,
            pattern=rf"^[\x21-\x7e]{{1,{MAX_CHARS}}}$",
            description="Sent again with the same request after a start whose answer never "
            "came, it reads the stream that start began instead of starting another "
            f"(the tenant's, while the stream is kept); 1 to {MAX_CHARS} visible ASCII "
            "characters, e.g. a UUID",
        ),
    ] = None,
) -> StartKey | None:
    """The start's key, with a digest of the request it came with (start_keys.py)."""
    return None if key is None else StartKey.of(key, request.url.path, await request.body())


StartKeyDep = Annotated[StartKey | None, Depends(get_start_key)]
