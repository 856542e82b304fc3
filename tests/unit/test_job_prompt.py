"""A section's prompt fits the window: the previous section's tail is cut first, then the
lowest-scored sources; [n] numbers run across the document."""

from __future__ import annotations

import pytest

from rag_stream.errors import PayloadTooLarge
from rag_stream.kinds.job.prompt import fit_section
from rag_stream.retrieval.retriever import SearchHit
from rag_stream.schemas.jobs import JobSpec
from tests.support.fakes import stub_engine

OUTLINE = ["Origins", "The keepers", "The lamp"]


def _hit(name: str, score: float, size: int = 200) -> SearchHit:
    return SearchHit(name, "doc", f"Doc {name}", None, name[0] * size, 0, size, score)


def _spec(section_tokens: int) -> JobSpec:
    return JobSpec(title="Skerry", sections=3, section_tokens=section_tokens, top_k=3)


def test_everything_is_kept_when_it_fits() -> None:
    engine = stub_engine(max_model_len=8192)
    hits = [_hit("a", 0.9), _hit("b", 0.5)]
    fitted = fit_section(engine, _spec(100), OUTLINE, 1, list(b"tail text"), hits, {})
    assert [n for n, _ in fitted.cited] == [1, 2]
    assert fitted.dropped == 0 and fitted.tail_tokens == 9
    text = engine.tokenizer.decode(fitted.prompt_ids)
    assert "...tail text" in text and "[2] Doc b" in text and '"The keepers"' in text


def test_numbers_continue_across_sections_and_repeat_for_a_known_chunk() -> None:
    engine = stub_engine(max_model_len=8192)
    hits = [_hit("new", 0.9), _hit("old", 0.8)]
    fitted = fit_section(engine, _spec(100), OUTLINE, 2, [], hits, {"old": 1, "other": 2})
    assert [(n, h.chunk_id) for n, h in fitted.cited] == [(3, "new"), (1, "old")]


def test_the_tail_goes_first_then_the_lowest_scores() -> None:
    engine = stub_engine(max_model_len=8192)
    hits = [_hit("a", 0.9), _hit("b", 0.2), _hit("c", 0.5)]
    tail = list(b"x" * 400)
    whole = fit_section(engine, _spec(100), OUTLINE, 1, tail, hits, {})
    size = len(whole.prompt_ids)
    # room for everything but ~300 tokens: the tail alone is shortened
    engine.max_model_len = size + 100 - 300
    cut = fit_section(engine, _spec(100), OUTLINE, 1, tail, hits, {})
    assert cut.dropped == 0 and 0 < cut.tail_tokens < 400
    assert len(cut.prompt_ids) + 100 <= engine.max_model_len
    # less room than the tail's whole size: no tail, and the worst source goes
    engine.max_model_len = size + 100 - 400 - 150
    cut = fit_section(engine, _spec(100), OUTLINE, 1, tail, hits, {})
    assert cut.tail_tokens == 0 and cut.dropped == 1
    assert sorted(h.chunk_id for _, h in cut.cited) == ["a", "c"]
    assert [n for n, _ in cut.cited] == [1, 2]  # numbered after fitting: no gap


def test_a_prompt_that_cannot_fit_even_bare_is_refused() -> None:
    engine = stub_engine(max_model_len=300)
    with pytest.raises(PayloadTooLarge, match="section_tokens 200"):
        fit_section(engine, _spec(200), OUTLINE, 0, [], [_hit("a", 0.9)], {})


class _TiedRetriever:
    """Returns the same hits in a given order, as two vector stores may order ties."""

    def __init__(self, hits: list[SearchHit]) -> None:
        self.hits = hits
        self.asked: list[int] = []

    async def search(self, kb_id: str, query: str, top_k: int, **_: object) -> list[SearchHit]:
        self.asked.append(top_k)
        return self.hits[:top_k]


def test_tied_scores_are_cut_in_chunk_id_order_whatever_the_store_returns() -> None:
    import asyncio

    from rag_stream.kinds.job.section import _search

    spec = JobSpec(title="t", sections=1, section_tokens=10, top_k=2)
    hits = [_hit("best", 0.9), _hit("zeta", 0.5), _hit("alpha", 0.5), _hit("low", 0.1)]
    for order in (hits, [hits[0], hits[2], hits[1], hits[3]]):
        retriever = _TiedRetriever(order)
        found = asyncio.run(_search(retriever, "kb", "q", spec))  # type: ignore[arg-type]
        assert [h.chunk_id for h in found] == ["best", "alpha"]
        assert retriever.asked == [4]  # more than top_k: the tie at the cut is seen whole
