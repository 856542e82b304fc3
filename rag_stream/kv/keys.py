"""Names for KV blocks: an engine-layout namespace and a chained hash per full block.

A block's KV depends on every token before it, so its key hashes the previous block's key
together with its own token ids; equal keys mean equal prefixes. The namespace folds in
everything that decides the bytes of a block (model, dtypes, block size, layer layout), so a
block is only ever found by the same kind of engine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import numpy as np

DIGEST_BYTES = 16


def namespace(layout: Mapping[str, object]) -> str:
    """A short stable id of an engine's KV layout (sorted JSON, hashed)."""
    text = json.dumps(layout, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def chain_seed(namespace_id: str, salt: str = "") -> bytes:
    """The 'previous hash' of a request's first block; a salt isolates tenants or adapters."""
    return hashlib.blake2b(f"{namespace_id}|{salt}".encode(), digest_size=DIGEST_BYTES).digest()


def extend_chain(
    hashes: list[bytes], token_ids: Sequence[int], block_size: int, seed: bytes, n_blocks: int
) -> list[bytes]:
    """Grow ``hashes`` (the chain so far, mutated) to cover the first ``n_blocks`` full blocks."""
    if n_blocks * block_size > len(token_ids):
        raise ValueError(f"{n_blocks} blocks need {n_blocks * block_size} tokens")
    prev = hashes[-1] if hashes else seed
    for i in range(len(hashes), n_blocks):
        ids = np.asarray(token_ids[i * block_size : (i + 1) * block_size], dtype="<u4")
        prev = hashlib.blake2b(prev + ids.tobytes(), digest_size=DIGEST_BYTES).digest()
        hashes.append(prev)
    return hashes


def block_hashes(token_ids: Sequence[int], block_size: int, seed: bytes) -> list[bytes]:
    """Chained hashes of every full block of ``token_ids``."""
    return extend_chain([], token_ids, block_size, seed, len(token_ids) // block_size)
