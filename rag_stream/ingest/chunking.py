"""Token-aware chunking with overlap that prefers paragraph and heading boundaries.

Works in the embedder's token space: the whole text is tokenized once with character offsets,
blocks (paragraphs, headings) become token ranges, and chunks are token ranges mapped back to
character spans. So ``text[chunk.start:chunk.end] == chunk.text`` always holds, and no chunk has
more tokens than the embedder reads.

Rules, in order:
- a heading starts a new chunk (a heading with no body of its own joins the next section);
- whole paragraphs are packed into a chunk while they fit;
- a paragraph too long for one chunk is cut at a line break, else a sentence end, else a word
  boundary, inside the last half of the window;
- each chunk after the first of a section repeats the last ``overlap`` tokens of the one
  before it (never across a heading), starting at a word boundary.

A token can span a word of any length (WordPiece reads a word of over 100 characters as one
``[UNK]``), so a hostile upload of one word of megabytes would be one chunk of megabytes, sent
whole in every search result and citation and tokenized whole for every prompt. Such a token
counts as one per ``MAX_TOKEN_CHARS`` characters and may be cut between them: a chunk holds at
most ``max_tokens * MAX_TOKEN_CHARS`` characters. (A chunk that starts or ends inside such a
word may then read as more tokens than it counts; the embedder truncates what is over its
window, and it could not read the word anyway.)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rag_stream.ingest.parsing import Block, ParsedText

Offsets = Sequence[tuple[int, int]]
_SENTENCE_END = (".", "!", "?", ";", ":")
MAX_TOKEN_CHARS = 100


@dataclass(frozen=True)
class ChunkSpan:
    ordinal: int
    start: int  # character offsets into the parsed text
    end: int
    text: str
    heading: str | None
    token_count: int


@dataclass(frozen=True)
class _Section:
    heading: str | None
    ranges: list[tuple[int, int]]  # token ranges of its blocks, in order
    heading_only: bool


def chunk_text(
    parsed: ParsedText,
    token_offsets: Callable[[str], list[tuple[int, int]]],
    max_tokens: int,
    overlap: int,
) -> list[ChunkSpan]:
    if max_tokens < 8:
        raise ValueError("max_tokens must be at least 8")
    overlap = max(0, min(overlap, max_tokens // 2))
    text = parsed.text
    offsets = [
        (a, min(a + MAX_TOKEN_CHARS, e))
        for s, e in token_offsets(text)
        for a in range(s, e, MAX_TOKEN_CHARS)
    ]
    if not offsets:
        return []
    blocks = parsed.blocks or [Block(0, len(text))]
    sections = _sections(blocks, offsets)
    budget = max_tokens - overlap
    spans: list[ChunkSpan] = []
    for section in sections:
        pieces = _pack(section.ranges, offsets, text, budget)
        floor = section.ranges[0][0]
        for i, (a, b) in enumerate(pieces):
            if i > 0 and overlap:
                a = _word_start(offsets, max(floor, a - overlap), a)
            start, end = offsets[a][0], offsets[b - 1][1]
            spans.append(ChunkSpan(len(spans), start, end, text[start:end], section.heading, b - a))
    return spans


def _sections(blocks: Sequence[Block], offsets: Offsets) -> list[_Section]:
    starts = [s for s, _ in offsets]
    sections: list[_Section] = []
    current: list[tuple[int, int]] = []
    heading: str | None = None
    heading_only = False
    previous: Block | None = None
    for block in blocks:
        a = bisect_left(starts, block.start)
        b = bisect_left(starts, block.end)
        if a >= b:
            continue
        new_section = previous is None or block.is_heading or block.section != previous.section
        if new_section and current:
            sections.append(_Section(heading, current, heading_only))
            current = []
        if new_section:
            heading, heading_only = block.section, block.is_heading
        elif not block.is_heading:
            heading_only = False
        current.append((a, b))
        previous = block
    if current:
        sections.append(_Section(heading, current, heading_only))
    # A heading with no body (a chapter title right before its first subsection) is carried
    # into the next section instead of becoming a chunk of its own.
    merged: list[_Section] = []
    carry: list[tuple[int, int]] = []
    for i, section in enumerate(sections):
        if section.heading_only and i + 1 < len(sections):
            carry.extend(section.ranges)
            continue
        merged.append(_Section(section.heading, carry + section.ranges, False))
        carry = []
    return merged


def _pack(
    ranges: Sequence[tuple[int, int]], offsets: Offsets, text: str, budget: int
) -> list[tuple[int, int]]:
    """Token ranges of at most ``budget`` tokens covering ``ranges``, cut at good places."""
    pieces: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for a, b in ranges:
        if current is not None and b - current[0] <= budget:
            current = (current[0], b)
            continue
        if current is not None:
            if current[1] - current[0] < budget // 4:
                # Too small to stand alone (say, a heading before a long paragraph): the
                # long range is cut starting from it instead.
                a = current[0]
            else:
                pieces.append(current)
        while b - a > budget:
            cut = _cut(offsets, text, a, a + budget)
            pieces.append((a, cut))
            a = cut
        current = (a, b)
    if current is not None:
        pieces.append(current)
    return pieces


def _cut(offsets: Offsets, text: str, a: int, limit: int) -> int:
    """Best token index in (a + half, limit] to end a piece at: line > sentence > word > any."""
    lowest = a + max(1, (limit - a) // 2)
    best_word = None
    best_sentence = None
    for t in range(limit, lowest - 1, -1):
        gap = text[offsets[t - 1][1] : offsets[t][0]]
        if "\n" in gap:
            return t
        if gap:
            if best_sentence is None and text[offsets[t - 1][1] - 1] in _SENTENCE_END:
                best_sentence = t
            if best_word is None:
                best_word = t
    return best_sentence or best_word or limit


def _word_start(offsets: Offsets, lo: int, hi: int) -> int:
    """The first token in [lo, hi) that starts after whitespace; hi if there is none."""
    for t in range(lo, hi):
        if t == 0 or offsets[t][0] > offsets[t - 1][1]:
            return t
    return hi
