"""Sparse (keyword) vectors for BM25: the interface, and the vector every store takes.

A document's vector holds, per term, its BM25 term-frequency weight (saturation ``k`` and
length normalization ``b`` already applied); a query's holds 1.0 per distinct term. The store
multiplies in the inverse document frequency at search time (Qdrant's IDF modifier), so adding
documents never rewrites the vectors of others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SparseVector:
    indices: list[int]  # term ids (hashes of the terms), ascending
    values: list[float]

    def __bool__(self) -> bool:
        return bool(self.indices)


class SparseEncoder(Protocol):
    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        """One document vector per text (blocking, pure CPU: call it off the event loop for
        many texts)."""
        ...

    def encode_query(self, text: str) -> SparseVector:
        """The query's terms, each once; empty when the text has no term (only stop words)."""
        ...
