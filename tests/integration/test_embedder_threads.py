"""The embedder's tokenizer, shared by threads: chunking one upload while another is embedded.

Found by the soak (scripts/soak.py): concurrent uploads got a 500 now and then, "Unable to
create tensor ... expected sequence of length 170 at dim 1 (got 151)". Each call of a fast
tokenizer sets its padding and truncation, and chunking's calls (token offsets, in a worker
thread) ran unlocked beside an encode's, undoing its padding mid-batch.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rag_stream.retrieval.embedder import LoadedEmbedder, load_embedder

# short texts of different lengths (an encode pads them to one length), and short chunking
# calls: many calls on both sides. On the old code this failed in 3 runs out of 4 with 6 s
# (each time within its first ten encodes); it runs 8 s a backend. A race: passing proves
# less than failing would. The torch backend shares one tokenizer under a lock; the onnx one
# has two, each configured once.
TEXTS = [" ".join(["harbour"] * n) for n in (1, 3, 7, 2, 9, 4, 12, 5)]
PIECE = "chunking the next upload"


@pytest.fixture(params=["torch", "onnx"])
async def embedder(request: pytest.FixtureRequest, embedder_path: Path) -> LoadedEmbedder:
    return await load_embedder(str(embedder_path), backend=request.param)


def test_chunking_in_other_threads_never_breaks_an_embedding(embedder: LoadedEmbedder) -> None:
    reference = embedder.encode_sync(TEXTS)
    stop = threading.Event()
    chunked = [0, 0]

    def chunk(slot: int) -> None:
        while not stop.is_set():
            embedder.token_offsets(PIECE)
            embedder.count_tokens(PIECE)
            chunked[slot] += 1

    threads = [threading.Thread(target=chunk, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    encodes = 0
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            vectors = embedder.encode_sync(TEXTS)  # raised ValueError before the fix
            assert np.allclose(vectors, reference, atol=1e-5)
            encodes += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert encodes and all(chunked), (encodes, chunked)  # both sides really ran meanwhile
