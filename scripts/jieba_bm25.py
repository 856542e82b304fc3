"""The alternative BM25 encoder issue 14 asked to measure against qdrant-edge's: jieba
segmentation and BM25 term-frequency weights computed here, for the benchmark only (jieba is
not a dependency of the package: ``.venv/bin/pip install jieba``).

- Segmentation: jieba over the whole text (it keeps runs of ASCII letters and digits as one
  token, so English words come out whole), in ``precise`` mode (``jieba.cut``, HMM on for
  unknown words) or ``search`` mode (``jieba.cut_for_search``: also the words inside long
  ones, 数据库 gives 数据 and 数据库, like edge's multilingual tokenizer).
- English: lowercased; no stemming (no stemmer is installed in the venv: no snowballstemmer,
  PyStemmer or nltk); stop words are edge's own English and Chinese lists, read by asking
  edge's encoder whether a token alone gives any term (cached), so the comparison is about
  segmentation and weighting, not about two different stop lists.
- Weights: a document's vector holds tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))
  per term (k1 1.2, b 0.75, ``avg_len`` the average terms per chunk), a query's 1.0 per
  distinct term; the store applies IDF at search time (the sparse vector's IDF modifier), as
  with edge's vectors. Term ids are the low 31 bits of a BLAKE2 hash of the term.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

import jieba

from rag_stream.retrieval.edge_bm25 import EdgeBm25
from rag_stream.retrieval.sparse import SparseVector

jieba.setLogLevel(60)
K1, B = 1.2, 0.75


class JiebaBm25:
    def __init__(self, avg_len: float, mode: str = "search") -> None:
        if mode not in ("precise", "search"):
            raise ValueError(f"unknown jieba mode {mode!r}")
        self.avg_len, self.mode = avg_len, mode
        self._cut: Callable[[str], Iterable[str]] = (
            jieba.cut_for_search if mode == "search" else jieba.cut
        )
        jieba.initialize()  # the dictionary loads once (~1 s), not inside the first encode
        self._edge = EdgeBm25()

    def terms(self, text: str) -> list[str]:
        out = []
        for token in self._cut(text):
            token = token.strip().lower()
            if token and any(c.isalnum() for c in token) and not self._stop(token):
                out.append(token)
        return out

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        return [self._document(self.terms(t)) for t in texts]

    def encode_query(self, text: str) -> SparseVector:
        ids = sorted({_term_id(t) for t in self.terms(text)})
        return SparseVector(ids, [1.0] * len(ids))

    def _document(self, terms: list[str]) -> SparseVector:
        norm = K1 * (1 - B + B * len(terms) / self.avg_len)
        weights: dict[int, float] = {}
        for term, tf in Counter(terms).items():
            key = _term_id(term)  # a 31-bit collision adds the two weights: rare, harmless
            weights[key] = weights.get(key, 0.0) + tf * (K1 + 1) / (tf + norm)
        ids = sorted(weights)
        return SparseVector(ids, [weights[i] for i in ids])

    def _stop(self, token: str) -> bool:
        return _edge_drops(self._edge, token)


@lru_cache(maxsize=200_000)
def _edge_drops(edge: EdgeBm25, token: str) -> bool:
    return not edge.encode_query(token)


@lru_cache(maxsize=200_000)
def _term_id(term: str) -> int:
    digest = hashlib.blake2b(term.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
