"""What an answer stream saves for a takeover, at its two stages.

- ``QuestionPlan``, saved before retrieval: the question, the prompt without its sources and
  how to search. A process that dies while searching leaves this one; a takeover searches
  again, as long as no citation went out.
- ``AnswerPlan``, saved once the sources are known (their citations sent): the whole prompt's
  token ids. A takeover continues the token phase from it and the logged ids.

``AnswerJob`` is an accepted question in memory, which a ``QuestionPlan`` stores and gives back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from rag_stream.generation.engine import Sampling
from rag_stream.generation.prompt import PromptLayout
from rag_stream.kinds.plan import TokenPlan
from rag_stream.schemas.events import CitationBody
from rag_stream.schemas.generate import Coalesce
from rag_stream.schemas.kbs import SearchMode


@dataclass(frozen=True)
class AnswerJob:
    """An accepted question, before retrieval."""

    kb_id: str
    question: str
    layout: PromptLayout
    top_k: int
    sampling: Sampling  # fitted to the window
    mmr: bool
    coalesce: Coalesce
    stop: list[str]
    mode: SearchMode = "hybrid"


class AnswerPlan(TokenPlan):
    kind: Literal["answer"] = "answer"
    kb_id: str
    question: str
    conversation_id: str
    citations: list[CitationBody]
    dropped_sources: int
    retrieval_ms: float


class QuestionPlan(TokenPlan):
    """``prompt_ids``: the prompt's stable part (the sources come after it)."""

    kind: Literal["answer_question"] = "answer_question"
    kb_id: str
    question: str
    conversation_id: str
    tail_template: str
    top_k: int
    mmr: bool
    mode: SearchMode

    @classmethod
    def of_job(cls, job: AnswerJob, conversation_id: str, queue_ms: float) -> QuestionPlan:
        return cls.of(
            job.layout.stable_ids,
            job.sampling,
            queue_ms=queue_ms,
            coalesce=job.coalesce,
            stop=job.stop,
            kb_id=job.kb_id,
            question=job.question,
            conversation_id=conversation_id,
            tail_template=job.layout.tail_template,
            top_k=job.top_k,
            mmr=job.mmr,
            mode=job.mode,
        )

    def job(self) -> AnswerJob:
        return AnswerJob(
            kb_id=self.kb_id,
            question=self.question,
            layout=PromptLayout(self.prompt_ids, self.tail_template),
            top_k=self.top_k,
            sampling=self.sampling(),
            mmr=self.mmr,
            coalesce=self.coalesce,
            stop=list(self.stop),
            mode=self.mode,
        )


SAVED_PLANS: TypeAdapter[AnswerPlan | QuestionPlan] = TypeAdapter(
    Annotated[AnswerPlan | QuestionPlan, Field(discriminator="kind")]
)
