"""Stop sequences: cut before the first one, never show part of one."""

from __future__ import annotations

from rag_stream.generation.detokenize import TextDelta
from rag_stream.generation.stop_strings import StopStrings


def _run(pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    s = StopStrings(stops)
    shown = []
    for i, piece in enumerate(pieces):
        out = s.push(TextDelta(i, [i], piece))
        if out is not None:
            shown.append(out.text)
        if s.hit:
            return shown, True
    tail = s.finish()
    if tail is not None:
        shown.append(tail.text)
    return shown, False


def test_text_is_cut_before_a_stop_split_across_tokens() -> None:
    shown, hit = _run(["Hello ", "wor", "ld", " EN", "D more"], ["END"])
    assert hit and "".join(shown) == "Hello world "
    # " EN" was held back until "D more" showed it was the stop: no client saw "EN"
    assert shown == ["Hello ", "wor", "ld", " "]


def test_a_false_start_is_released_when_the_text_moves_on() -> None:
    shown, hit = _run(["a", "E", "N", "x", "b"], ["END"])
    assert not hit and shown == ["a", "ENx", "b"]


def test_held_text_is_shown_when_generation_ends_without_a_stop() -> None:
    shown, hit = _run(["a", "EN"], ["END"])
    assert not hit and shown == ["a", "EN"]


def test_the_earliest_of_several_stops_wins_and_ids_stay_whole() -> None:
    s = StopStrings(["xyz", "b"])
    assert s.push(TextDelta(0, [10], "a")) is not None
    out = s.push(TextDelta(1, [11, 12], "cxyzb"))
    assert s.hit and out is not None
    assert out.text == "c" and out.token_ids == [11, 12] and out.index == 1


def test_no_stops_passes_every_delta_through() -> None:
    shown, hit = _run(["a", "b"], [])
    assert shown == ["a", "b"] and not hit
