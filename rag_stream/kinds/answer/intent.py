"""What an ``answer`` stream is asked: a ``Question``, and the translations into one from each
request that asks it (``/v1/answers``; a chat on ``kb:<name>``, over chat completions or the AI
SDK's UI messages)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rag_stream.generation.engine import Sampling
from rag_stream.generation.priority import PriorityClass
from rag_stream.generation.prompt import Turn
from rag_stream.generation.sampling import sampling_for
from rag_stream.schemas.answers import AnswerRequest
from rag_stream.schemas.chat import ChatAsk
from rag_stream.schemas.generate import Coalesce
from rag_stream.schemas.kbs import SearchMode
from rag_stream.settings import LimitsSettings


@dataclass(frozen=True)
class Question:
    """A question on a KB, however the request spelled it: the history comes from a stored
    conversation (``conversation_id``) or from the request's messages (``history``)."""

    kb: str  # name or id, of the tenant's KBs (another tenant's: 404)
    text: str
    sampling: Sampling
    coalesce: Coalesce
    history: Sequence[Turn] = ()
    top_k: int | None = None  # None: answers.default_top_k
    mmr: bool = False
    mode: SearchMode = "hybrid"  # how retrieval searches (schemas/kbs.py)
    conversation_id: str | None = None  # continue this stored conversation
    instructions: str | None = None  # the client's system messages, after ours
    stop: Sequence[str] = ()
    priority: PriorityClass = "interactive"  # as asked; a long prompt runs as batch


def question_from_request(
    body: AnswerRequest, limits: LimitsSettings, coalesce: Coalesce
) -> Question:
    """``/v1/answers``: the question, and the stored conversation it continues, if any."""
    return Question(
        kb=body.kb,
        text=body.question,
        sampling=sampling_for(limits, body.max_tokens, body.temperature, body.top_p, body.seed),
        coalesce=coalesce,
        top_k=body.top_k,
        mmr=body.mmr,
        mode=body.mode,
        conversation_id=body.conversation_id,
        priority=body.priority,
    )


def question_from_chat(body: ChatAsk, kb: str, sampling: Sampling, coalesce: Coalesce) -> Question:
    """A chat on ``kb:<name>`` (any wire, schemas/chat.py): the last message is the question,
    earlier user and assistant turns the history, and system (or developer) messages follow
    our system prompt."""
    *earlier, last = body.messages
    instructions = "\n\n".join(
        m.text for m in earlier if m.role in ("system", "developer") and m.text.strip()
    )
    history = [Turn(m.role, m.text) for m in earlier if m.role in ("user", "assistant") and m.text]
    return Question(
        kb=kb,
        text=last.text,
        sampling=sampling,
        coalesce=coalesce,
        history=history,
        top_k=body.top_k,
        mmr=body.mmr,
        mode=body.mode,
        instructions=instructions or None,
        stop=body.stops,
        priority=body.priority,
    )
