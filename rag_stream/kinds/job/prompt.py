"""A job section's prompt, made to fit the context window with room for the section.

The prompt holds the document's title, instructions and outline, the end of the previous
section (its last token ids, at most ``jobs.tail_tokens``), the section's sources and its
heading. Measured with the tokenizer; when prompt + ``section_tokens`` would not fit
``max_model_len``, the tail is shortened first, then sources are dropped, lowest score first.

Sources are numbered across the whole document: a chunk an earlier section cited keeps its
number, a new one gets the next. Numbers are given after fitting, so dropped sources use none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rag_stream.errors import PayloadTooLarge
from rag_stream.generation.engine import Engine
from rag_stream.generation.prompt import Source, format_sources
from rag_stream.retrieval.retriever import SearchHit
from rag_stream.schemas.jobs import JobSpec

SECTION_SYSTEM = (
    "You write one section of a longer document from a knowledge base. Use only the numbered "
    "sources given. Cite each fact with the number of its source in square brackets, like "
    "[2]. Write the section's text only: no heading and no title."
)


@dataclass(frozen=True)
class FittedSection:
    prompt_ids: list[int]
    cited: list[tuple[int, SearchHit]]  # (n, hit) for each source in the prompt, best first
    dropped: int  # hits left out for room
    tail_tokens: int  # of the previous section's end, kept in the prompt


def _text(
    spec: JobSpec,
    outline: Sequence[str],
    index: int,
    tail: str,
    previous: str | None,
    sources: Sequence[Source],
) -> str:
    lines = [f"Document title: {spec.title}"]
    if spec.instructions:
        lines.append(f"Instructions: {spec.instructions}")
    lines.append("Outline:")
    lines += [f"{i + 1}. {h}" for i, h in enumerate(outline)]
    if tail and previous is not None:
        lines += ["", f'The previous section ("{previous}") ended with:', f"...{tail}"]
    lines += ["", "Sources:", format_sources(sources).rstrip("\n"), ""]
    lines.append(f'Write section {index + 1}, "{outline[index]}".')
    return "\n".join(lines)


def _ids(engine: Engine, text: str) -> list[int]:
    messages = [
        {"role": "system", "content": SECTION_SYSTEM},
        {"role": "user", "content": text},
    ]
    return engine.tokenizer.encode(engine.chat_prompt(messages), add_special_tokens=False)


def _numbers(hits: Sequence[SearchHit], known: Mapping[str, int]) -> list[int]:
    """Each hit's [n]: its earlier number, or the next free one, in hit order."""
    next_n = max(known.values(), default=0) + 1
    numbers: list[int] = []
    for hit in hits:
        if hit.chunk_id in known:
            numbers.append(known[hit.chunk_id])
        else:
            numbers.append(next_n)
            next_n += 1
    return numbers


def fit_section(
    engine: Engine,
    spec: JobSpec,
    outline: Sequence[str],
    index: int,
    tail_ids: Sequence[int],
    hits: Sequence[SearchHit],
    known: Mapping[str, int],
) -> FittedSection:
    """The section's prompt ids within ``max_model_len - spec.section_tokens``."""
    room = engine.max_model_len - spec.section_tokens
    previous = outline[index - 1] if index > 0 else None
    keep = list(range(len(hits)))
    tail_n = len(tail_ids)

    def build(kept: list[int], n_tail: int) -> list[int]:
        chosen = [hits[i] for i in kept]
        sources = [
            Source(n, h.title, h.heading, h.text)
            for n, h in zip(_numbers(chosen, known), chosen, strict=True)
        ]
        tail = engine.tokenizer.decode(list(tail_ids[len(tail_ids) - n_tail :]), True)
        return _ids(engine, _text(spec, outline, index, tail if n_tail else "", previous, sources))

    ids = build(keep, tail_n)
    while len(ids) > room and tail_n > 0:
        tail_n //= 2
        ids = build(keep, tail_n)
    by_score = sorted(keep, key=lambda i: hits[i].score)  # lowest first
    while len(ids) > room and by_score:
        keep.remove(by_score.pop(0))
        ids = build(keep, tail_n)
    if len(ids) > room:
        raise PayloadTooLarge(
            f"section {index + 1}'s prompt is {len(ids)} tokens without sources; with "
            f"section_tokens {spec.section_tokens} it does not fit the model's context window "
            f"({engine.max_model_len} tokens): shorten the title, instructions or outline"
        )
    chosen = [hits[i] for i in keep]
    cited = list(zip(_numbers(chosen, known), chosen, strict=True))
    return FittedSection(ids, cited, len(hits) - len(keep), tail_n)


def check_fits(engine: Engine, spec: JobSpec, outline: Sequence[str] | None) -> None:
    """At accept time: the longest section prompt with no sources and no tail fits."""
    headings = outline or [" " * 40] * spec.sections  # a planned outline: a guess at its size
    longest = max(range(len(headings)), key=lambda i: len(headings[i]))
    fit_section(engine, spec, headings, longest, [], [], {})
