"""Maximal marginal relevance: pick results that are relevant and unlike those already picked."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def mmr_order(
    relevance: Sequence[float],
    vectors: npt.NDArray[np.float32],
    k: int,
    diversity: float = 0.5,
) -> list[int]:
    """Indices of up to k candidates, each maximizing
    ``(1 - diversity) * relevance - diversity * max similarity to those already chosen``.

    ``vectors`` are unit-normalized rows, one per candidate, so dot products are cosines.
    """
    n = len(relevance)
    if n == 0 or k <= 0:
        return []
    rel = np.asarray(relevance, dtype=np.float32)
    sims = vectors @ vectors.T
    chosen: list[int] = []
    closest = np.full(n, -np.inf, dtype=np.float32)  # max similarity to the chosen set
    available = np.ones(n, dtype=bool)
    for _ in range(min(k, n)):
        penalty = np.where(np.isfinite(closest), closest, 0.0)
        score = (1.0 - diversity) * rel - diversity * penalty
        score[~available] = -np.inf
        best = int(np.argmax(score))
        chosen.append(best)
        available[best] = False
        closest = np.maximum(closest, sims[best])
    return chosen
