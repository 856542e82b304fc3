"""Request dependencies: everything comes from ``app.state.resources``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from rag_stream.ingest.service import Ingestor
from rag_stream.resources import Resources
from rag_stream.retrieval.retriever import Retriever
from rag_stream.settings import Settings
from rag_stream.streaming.service import Streams


def get_resources(request: Request) -> Resources:
    resources: Resources = request.app.state.resources
    return resources


ResourcesDep = Annotated[Resources, Depends(get_resources)]


def get_settings(resources: ResourcesDep) -> Settings:
    return resources.settings


def get_streams(resources: ResourcesDep) -> Streams:
    return resources.streams


def get_ingestor(resources: ResourcesDep) -> Ingestor:
    return resources.ingestor


def get_retriever(resources: ResourcesDep) -> Retriever:
    return resources.retriever


async def get_session(resources: ResourcesDep) -> AsyncIterator[AsyncSession]:
    """A session for a route that only reads; streams and services open their own."""
    async with resources.sessions() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
StreamsDep = Annotated[Streams, Depends(get_streams)]
IngestorDep = Annotated[Ingestor, Depends(get_ingestor)]
RetrieverDep = Annotated[Retriever, Depends(get_retriever)]
SessionDep = Annotated[AsyncSession, Depends(get_session)]
