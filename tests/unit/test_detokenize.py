"""Incremental detokenization with a byte-level tokenizer: every multi-byte character spans
several tokens, so every cut point inside a character is exercised."""

from __future__ import annotations

from typing import Any

from rag_stream.generation.detokenize import Detokenizer
from tests.support.fakes import ByteTokenizer

TOK = ByteTokenizer()
TEXT = "RAG 流式回答：引用先到，然后是逐个词元。Ünïcödé ✓ 🚀 done."


def _stream(tokenizer: Any, ids: list[int], seed: list[int] | None = None) -> list[str]:
    detok = Detokenizer(tokenizer, seed or [])
    deltas = []
    for token in ids:
        delta = detok.push(token)
        if delta is not None:
            deltas.append(delta)
    tail = detok.finish()
    if tail is not None:
        deltas.append(tail)
    return [d.text for d in deltas]


def test_deltas_are_whole_characters_and_rebuild_the_text() -> None:
    ids = TOK.encode(TEXT)
    pieces = _stream(TOK, ids)
    assert any("\ufffd" in TOK.decode([t]) for t in ids)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT


def test_seeded_detokenizer_continues_exactly_at_every_cut() -> None:
    ids = TOK.encode(TEXT)
    for cut in range(1, len(ids)):
        first = Detokenizer(TOK)
        emitted: list[int] = []
        text = ""
        for token in ids[:cut]:
            delta = first.push(token)
            if delta is not None:
                emitted.extend(delta.token_ids)
                text += delta.text
        rest = _stream(TOK, ids[len(emitted) :], seed=emitted)
        assert text + "".join(rest) == TEXT, cut


def test_a_truncated_character_is_flushed_at_the_end() -> None:
    ids = TOK.encode("ab流")[:-1]  # the stream ends inside the last character
    assert "".join(_stream(TOK, ids)) == "ab\ufffd"
