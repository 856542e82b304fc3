"""Chunking with the embedder's real tokenizer (only the tokenizer is loaded: fast)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from rag_stream.ingest.chunking import MAX_TOKEN_CHARS, ChunkSpan, chunk_text
from rag_stream.ingest.parsing import parse_html, parse_markdown, parse_plain

Offsets = list[tuple[int, int]]


@pytest.fixture(scope="module")
def offsets(embedder_path: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(embedder_path))

    def token_offsets(text: str) -> Offsets:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    return token_offsets


def _sentences(n: int, word: str = "alpha") -> str:
    return " ".join(f"Sentence {i} talks about {word} number {i}." for i in range(n))


def _check_offsets(text: str, chunks: list[ChunkSpan]) -> None:
    for i, chunk in enumerate(chunks):
        assert chunk.ordinal == i
        assert text[chunk.start : chunk.end] == chunk.text
        assert chunk.text == chunk.text.strip()


def test_chunks_never_exceed_the_token_budget_and_cover_the_text(offsets) -> None:  # type: ignore[no-untyped-def]
    parsed = parse_plain(_sentences(80))
    chunks = chunk_text(parsed, offsets, max_tokens=50, overlap=10)
    _check_offsets(parsed.text, chunks)
    assert len(chunks) > 5
    assert all(c.token_count <= 50 for c in chunks)
    assert all(len(offsets(c.text)) <= 50 for c in chunks)
    assert chunks[0].start == 0 and chunks[-1].end == len(parsed.text)
    # consecutive chunks overlap (no gap in coverage) but do not repeat whole chunks
    for before, after in itertools.pairwise(chunks):
        assert after.start < before.end < after.end


def test_long_paragraphs_are_cut_at_sentence_ends(offsets) -> None:  # type: ignore[no-untyped-def]
    parsed = parse_plain(_sentences(60))
    chunks = chunk_text(parsed, offsets, max_tokens=64, overlap=0)
    assert all(c.text.endswith(".") for c in chunks)


def test_overlap_repeats_the_tail_of_the_previous_chunk(offsets) -> None:  # type: ignore[no-untyped-def]
    parsed = parse_plain(_sentences(40))
    chunks = chunk_text(parsed, offsets, max_tokens=40, overlap=12)
    for before, after in itertools.pairwise(chunks):
        shared = parsed.text[after.start : before.end]
        assert 4 <= len(offsets(shared)) <= 12
        assert parsed.text[after.start - 1].isspace()  # starts on a word boundary
    without = chunk_text(parsed, offsets, max_tokens=40, overlap=0)
    assert all(b.start > a.end for a, b in itertools.pairwise(without))


def test_paragraphs_are_packed_whole_when_they_fit(offsets) -> None:  # type: ignore[no-untyped-def]
    paragraphs = [_sentences(2, w) for w in ("red", "green", "blue", "black", "white", "pink")]
    parsed = parse_plain("\n\n".join(paragraphs))
    chunks = chunk_text(parsed, offsets, max_tokens=60, overlap=0)
    _check_offsets(parsed.text, chunks)
    assert 1 < len(chunks) < len(paragraphs)
    for chunk in chunks:  # every chunk is a run of whole paragraphs
        assert chunk.text.split("\n\n")[0] in paragraphs
        assert chunk.text.split("\n\n")[-1] in paragraphs


def test_headings_start_chunks_and_name_them(offsets) -> None:  # type: ignore[no-untyped-def]
    text = (
        "# Manual\n\n## Install\n\nRun the installer and accept the licence.\n\n"
        "## Usage\n\nStart the app from the menu.\n\nClose it with the red button.\n"
    )
    parsed = parse_markdown(text)
    chunks = chunk_text(parsed, offsets, max_tokens=200, overlap=20)
    _check_offsets(parsed.text, chunks)
    assert [c.heading for c in chunks] == ["Install", "Usage"]
    # a heading with no body of its own goes with the next section, not into a chunk alone
    assert chunks[0].text.startswith("# Manual\n\n## Install")
    assert chunks[1].text.startswith("## Usage") and chunks[1].text.endswith("red button.")


def test_html_and_pdf_style_sections_give_headings(offsets) -> None:  # type: ignore[no-untyped-def]
    html = "<h1>Guide</h1><p>" + _sentences(3) + "</p><h2>Errors</h2><p>Read the log.</p>"
    parsed = parse_html(html)
    chunks = chunk_text(parsed, offsets, max_tokens=100, overlap=10)
    _check_offsets(parsed.text, chunks)
    assert [c.heading for c in chunks] == ["Guide", "Errors"]


def test_text_without_tokens_gives_no_chunks(offsets) -> None:  # type: ignore[no-untyped-def]
    assert chunk_text(parse_plain("   \n\n  "), offsets, max_tokens=50, overlap=5) == []


def test_a_word_of_a_million_characters_becomes_bounded_chunks(offsets) -> None:  # type: ignore[no-untyped-def]
    # one token to the embedder ([UNK]): it was one chunk of a million characters
    text = "Before the word.\n\n" + "a" * 1_000_000 + "\n\nAfter the word."
    parsed = parse_plain(text)
    chunks = chunk_text(parsed, offsets, max_tokens=200, overlap=32)
    _check_offsets(text, chunks)
    assert max(len(c.text) for c in chunks) <= 200 * MAX_TOKEN_CHARS
    assert len(chunks) >= 1_000_000 // (200 * MAX_TOKEN_CHARS)
    # and they still cover the text, in order
    assert chunks[0].text.startswith("Before the word.")
    assert chunks[-1].text.endswith("After the word.")
    for before, after in itertools.pairwise(chunks):
        assert (
            before.start < after.start <= before.end or not text[before.end : after.start].strip()
        )


def test_words_the_embedder_reads_are_never_cut(offsets) -> None:  # type: ignore[no-untyped-def]
    word = "b" * MAX_TOKEN_CHARS  # the longest word WordPiece splits rather than [UNK]s
    text = " ".join([word] * 400)
    chunks = chunk_text(parse_plain(text), offsets, max_tokens=50, overlap=0)
    assert all(c.text.split(" ") == [word] * len(c.text.split(" ")) for c in chunks)
