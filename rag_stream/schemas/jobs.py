"""Long-document generation jobs: the request, what SQL keeps of them, and the responses.

The configured bounds (``jobs.*`` settings: sections, section tokens, title length) are checked
when a job is accepted, with messages naming the setting; the bounds here only keep absurd
values out before that.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.config import JsonDict

from rag_stream.schemas.events import CitationBody, FinishReason
from rag_stream.schemas.generate import Seed
from rag_stream.schemas.kbs import MODE_DESCRIPTION, SearchMode

JobStatus = Literal["queued", "running", "completed", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
SECTIONS_CEILING = 100
SECTION_TOKENS_CEILING = 1_000_000
TEXT_CEILING = 100_000
# A heading holds something besides whitespace: said in the schema for clients and the fuzzer,
# checked by the validator below, whose message names the heading. (The pattern is documented
# only: Python's idea of whitespace, which str.strip uses, is wider than that of the Rust regex
# pydantic would check it with. The title has the same rule but not the pattern: with its
# 100,000-character bound, schemathesis's coverage phase then made no case for the operation.)
_NOT_BLANK: JsonDict = {"pattern": r"\S"}
Heading = Annotated[
    str,
    Field(
        description="a section heading: not empty, not only whitespace",
        json_schema_extra=_NOT_BLANK,
    ),
]


class JobRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True
    )  # JSON types as they are: no "7" for 7, no 0 for false

    kb: str = Field(min_length=1, description="knowledge base name or id")
    title: str = Field(min_length=1, max_length=TEXT_CEILING)
    instructions: str | None = Field(None, max_length=TEXT_CEILING)
    outline: list[Heading] | None = Field(
        None,
        min_length=1,
        max_length=SECTIONS_CEILING,
        description="the section headings; absent: the model plans `sections` of them",
    )
    sections: int | None = Field(
        None, ge=1, le=SECTIONS_CEILING, description="how many sections to plan (no outline)"
    )
    section_tokens: int | None = Field(None, ge=1, le=SECTION_TOKENS_CEILING)
    top_k: int | None = Field(None, ge=0, le=1000, description="sources retrieved per section")
    mode: SearchMode = Field("hybrid", description=MODE_DESCRIPTION)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    seed: Seed | None = None

    @field_validator("title")
    @classmethod
    def _title_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty or only whitespace")
        return value.strip()

    @field_validator("outline")
    @classmethod
    def _headings_not_blank(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for i, heading in enumerate(value):
            if not heading.strip():
                raise ValueError(f"heading {i} is empty")
        return [h.strip() for h in value]


class JobSpec(BaseModel):
    """A job as accepted (the ``jobs.spec`` column and the stream's saved plan): everything
    any process needs to run it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str
    instructions: str | None = None
    outline: list[str] | None = None  # given by the client; None: planned
    sections: int  # the number of sections (the outline's length when one is given)
    section_tokens: int
    top_k: int
    mode: SearchMode = "hybrid"
    temperature: float = 0.0
    seed: int | None = None


class SectionCitations(BaseModel):
    """The ``job_sections.citations`` column: the sources one section's prompt held."""

    citations: list[CitationBody] = []


class JobError(BaseModel):
    code: str
    message: str


class JobProgress(BaseModel):
    sections_done: int
    sections_total: int
    tokens: int
    elapsed_s: float | None  # since the job started (to its end once finished)
    eta_s: float | None  # the time left at the rate of the sections so far (None: unknown)


class JobOut(BaseModel):
    id: str
    kb_id: str
    title: str
    status: JobStatus
    stream_id: str | None
    outline: list[str] | None
    section_tokens: int  # the most tokens a section may have
    progress: JobProgress
    error: JobError | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobList(BaseModel):
    """The shape of every list of this API (``data``), with the cursor the conversation list
    has too."""

    data: list[JobOut]
    limit: int
    next_before: str | None  # pass as ?before= for the next (older) page


class SourceOut(BaseModel):
    n: int
    chunk_id: str
    document_id: str
    title: str
    heading: str | None
    url: str  # GET /v1/kbs/{kb}/chunks/{chunk_id}


class SectionOut(BaseModel):
    index: int
    heading: str
    text: str
    tokens: int
    finish_reason: FinishReason
    cited: list[int]  # the [n] markers the text uses that name one of its sources


class JobResult(BaseModel):
    id: str
    title: str
    status: JobStatus
    complete: bool  # every section is written
    sections: list[SectionOut]
    sources: list[SourceOut]
