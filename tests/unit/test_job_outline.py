"""Parsing a planned outline: exactly N headings or nothing."""

from __future__ import annotations

import pytest

from rag_stream.pipeline.job_outline import parse_outline


@pytest.mark.parametrize(
    "reply",
    [
        "Origins\nThe keepers\nThe lamp",
        "1. Origins\n2. The keepers\n3. The lamp",
        "Here is the outline:\n\n- Origins\n- The keepers\n- The lamp\n",
        "## Origins\n## The keepers\n## The lamp",
        "1) **Origins**\n2) **The keepers**\n3) **The lamp**",
        "Section 1: Origins\nSection 2: The keepers\nSection 3: The lamp",
        "I. Origins\nII. The keepers\nIII. The lamp",
    ],
)
def test_numbering_bullets_and_an_introduction_are_stripped(reply: str) -> None:
    assert parse_outline(reply, 3, 200) == ["Origins", "The keepers", "The lamp"]


@pytest.mark.parametrize(
    "reply",
    [
        "Origins\nThe keepers",  # too few
        "Origins\nThe keepers\nThe lamp\nThe storm",  # too many
        "1.\n2.\n3.",  # numbers only
        "",
        "Origins:\nKeepers:\nLamp:",  # sub-point introductions, not headings
        "Origins\nThe keepers\n" + "x" * 201,  # a heading over the limit
    ],
)
def test_anything_but_exactly_n_headings_is_refused(reply: str) -> None:
    assert parse_outline(reply, 3, 200) is None
