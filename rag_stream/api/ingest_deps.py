"""Dependencies of the knowledge-base routes (the ingestor is built in the app lifespan)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from rag_stream.api.deps import ResourcesDep
from rag_stream.errors import ServiceUnavailable
from rag_stream.ingest.service import Ingestor
from rag_stream.retrieval.retriever import Retriever


def get_ingestor(request: Request) -> Ingestor:
    ingestor: Ingestor | None = getattr(request.app.state, "ingestor", None)
    if ingestor is None:
        raise ServiceUnavailable("ingestion is not available in this process")
    return ingestor


def get_retriever(resources: ResourcesDep) -> Retriever:
    return resources.retriever


IngestorDep = Annotated[Ingestor, Depends(get_ingestor)]
RetrieverDep = Annotated[Retriever, Depends(get_retriever)]
