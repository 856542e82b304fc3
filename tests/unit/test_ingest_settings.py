"""The ingest settings group: profile values and the overlap check."""

from __future__ import annotations

import pytest

from rag_stream.errors import ConfigError
from rag_stream.settings import load_settings


def test_sample_kb_is_on_by_default_and_off_for_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_PROFILE", "default")
    assert load_settings().ingest.sample_kb is True
    monkeypatch.setenv("RAG_STREAM_PROFILE", "test")
    assert load_settings().ingest.sample_kb is False


def test_overlap_larger_than_half_a_chunk_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_INGEST__CHUNK_TOKENS", "100")
    monkeypatch.setenv("RAG_STREAM_INGEST__CHUNK_OVERLAP", "60")
    with pytest.raises(ConfigError, match=r"RAG_STREAM_INGEST.*chunk_overlap"):
        load_settings()
