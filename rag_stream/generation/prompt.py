"""Prompt layout for answers: the stable part first, the retrieved sources after it.

The stable part (system prompt, conversation history, the question) is known the moment a
request arrives, so it can be prefilled into the prefix cache while retrieval runs. The model's
chat template is rendered once with a placeholder where the sources go; the text before the
placeholder is the stable part, and the full prompt's token ids are the stable ids followed by
the ids of the rest, so the stable ids are an exact token prefix of the full prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rag_stream.generation.engine import Engine

SYSTEM_PROMPT = (
    "You are a careful assistant that answers questions from a knowledge base. Use only the "
    "numbered sources given after the question. Cite each fact with the number of its source in "
    "square brackets, like [1]. If the sources do not contain the answer, say that you do not "
    "know."
)
_PLACEHOLDER = "\u2063SOURCES\u2063"  # invisible separator: never in real text


@dataclass(frozen=True)
class Turn:
    role: str  # "user" | "assistant"
    content: str


@dataclass(frozen=True)
class Source:
    n: int
    title: str
    heading: str | None
    text: str


@dataclass(frozen=True)
class PromptLayout:
    stable_ids: list[int]
    tail_template: str  # text after the sources (closes the user turn, opens the answer)

    def full_ids(self, engine: Engine, sources: Sequence[Source]) -> list[int]:
        tail = format_sources(sources) + self.tail_template
        return [*self.stable_ids, *engine.tokenizer.encode(tail, add_special_tokens=False)]

    def source_cost(self, engine: Engine, source: Source) -> int:
        return len(engine.tokenizer.encode(format_source(source), add_special_tokens=False))


def format_source(source: Source) -> str:
    where = f"{source.title} — {source.heading}" if source.heading else source.title
    return f"[{source.n}] {where}\n{source.text.strip()}\n\n"


def format_sources(sources: Sequence[Source]) -> str:
    if not sources:
        return "(no sources found)\n"
    return "".join(format_source(s) for s in sources)


def _render(
    engine: Engine, history: Sequence[Turn], question: str, instructions: str | None
) -> tuple[str, str]:
    system = SYSTEM_PROMPT if not instructions else f"{SYSTEM_PROMPT}\n\n{instructions}"
    messages = [{"role": "system", "content": system}]
    messages += [{"role": t.role, "content": t.content} for t in history]
    messages.append(
        {"role": "user", "content": f"Question: {question}\n\nSources:\n{_PLACEHOLDER}"}
    )
    text = engine.chat_prompt(messages)
    head, _, tail = text.partition(_PLACEHOLDER)
    return head, tail


def layout(
    engine: Engine,
    history: Sequence[Turn],
    question: str,
    history_budget: int,
    instructions: str | None = None,
) -> PromptLayout:
    """Lay out the prompt, keeping the newest history turns that fit in history_budget tokens
    (oldest dropped first, whole user/assistant pairs at a time). ``instructions`` (a client's
    own system prompt) follow the built-in one."""
    bare_head, tail = _render(engine, [], question, instructions)
    bare = len(engine.tokenizer.encode(bare_head, add_special_tokens=False))
    kept = list(history)
    while kept:
        head, tail = _render(engine, kept, question, instructions)
        ids = engine.tokenizer.encode(head, add_special_tokens=False)
        if len(ids) - bare <= history_budget:
            return PromptLayout(ids, tail)
        kept = kept[2:]
    return PromptLayout(engine.tokenizer.encode(bare_head, add_special_tokens=False), tail)
