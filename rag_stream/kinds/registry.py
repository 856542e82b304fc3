"""The kinds of stream this service runs: one line each. The app builds every kind listed here,
registers it for takeovers and serves its routes; adding a kind is its folder and a line here."""

from __future__ import annotations

from rag_stream.kinds.answer import routes as answer
from rag_stream.kinds.base import KindSlice
from rag_stream.kinds.generate import routes as generate
from rag_stream.kinds.job import routes as job

KINDS: tuple[KindSlice, ...] = (
    generate.KIND,
    answer.KIND,
    job.KIND,
)
