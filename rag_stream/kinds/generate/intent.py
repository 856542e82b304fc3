"""What a ``generate`` stream is asked: a ``Prompt``, and the translations into one from each
request that asks for it (``/v1/generate``; a chat on the engine's model, over chat completions or
the AI SDK's UI messages)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rag_stream.generation.engine import Sampling
from rag_stream.generation.priority import PriorityClass
from rag_stream.generation.sampling import sampling_for
from rag_stream.schemas.chat import ChatAsk
from rag_stream.schemas.generate import Coalesce, GenerateRequest
from rag_stream.settings import LimitsSettings


@dataclass(frozen=True)
class Prompt:
    """What to generate after: a raw prompt, or messages the model's chat template lays out."""

    sampling: Sampling
    coalesce: Coalesce
    text: str = ""  # a raw prompt (used when ``messages`` is empty)
    messages: Sequence[dict[str, str]] = ()  # role/content pairs
    stop: Sequence[str] = ()
    priority: PriorityClass = "interactive"  # as asked; a long prompt runs as batch

    @property
    def chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages) if self.messages else len(self.text)


def prompt_from_request(
    body: GenerateRequest, limits: LimitsSettings, coalesce: Coalesce
) -> Prompt:
    """``/v1/generate``: the prompt as it is, or (``chat``) as one user message."""
    sampling = sampling_for(limits, body.max_tokens, body.temperature, body.top_p, body.seed)
    if body.chat:
        turn = {"role": "user", "content": body.prompt}
        return Prompt(sampling, coalesce, messages=[turn], priority=body.priority)
    return Prompt(sampling, coalesce, text=body.prompt, priority=body.priority)


def prompt_from_chat(body: ChatAsk, sampling: Sampling, coalesce: Coalesce) -> Prompt:
    """A chat on the engine's model (any wire, schemas/chat.py): its messages, a developer
    message read as the system message it stands for."""
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text}
        for m in body.messages
    ]
    return Prompt(sampling, coalesce, messages=messages, stop=body.stops, priority=body.priority)
