"""Incremental detokenization with SmolLM2's real byte-level BPE tokenizer."""

from __future__ import annotations

from typing import Any

from rag_stream.generation.detokenize import Detokenizer
from tests.unit.test_detokenize import TEXT, _stream


def test_deltas_are_whole_characters_and_rebuild_the_text(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = _stream(tokenizer, ids)
    # the tokenizer really splits characters across tokens, so holding back matters here
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT


def test_seeded_detokenizer_continues_exactly_at_every_cut(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    for cut in range(1, len(ids)):
        first = Detokenizer(tokenizer)
        emitted: list[int] = []
        text = ""
        for token in ids[:cut]:
            delta = first.push(token)
            if delta is not None:
                emitted.extend(delta.token_ids)
                text += delta.text
        # a takeover only knows the ids that reached the log; it regenerates the rest
        rest = _stream(tokenizer, ids[len(emitted) :], seed=emitted)
        assert text + "".join(rest) == TEXT, cut


def test_delta_reports_token_positions(tokenizer: Any) -> None:
    ids = tokenizer.encode("hello world, again", add_special_tokens=False)
    detok = Detokenizer(tokenizer)
    positions = []
    for token in ids:
        delta = detok.push(token)
        if delta is not None:
            positions.append((delta.index, len(delta.token_ids)))
    assert positions == [(i, 1) for i in range(len(ids))]
