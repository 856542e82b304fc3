"""Moving KV blocks between vLLM's paged cache tensors and Redis (worker side).

Value of one block: the store header, then the block of every layer in model order, each as
vLLM holds it (on the CPU backend ``[kv_heads, block_size, 2 * head_size]``). One value per
block keeps a load to one MGET per chunk of blocks, whatever the layer count.

Loads are pipelined: the next chunk is fetched on a helper thread while the current one is
copied into the cache. Saves copy the blocks out of the cache (the forward pass waits only for
that copy) and a writer thread serializes and writes them; if the writer falls more than
``max_pending_bytes`` behind, new saves are dropped rather than waited for.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from rag_stream.kv.store import RedisBlockStore

log = logging.getLogger(__name__)

LOAD_CHUNK_BLOCKS = 4
WRITE_BATCH_BYTES = 32 << 20


class BlockMover:
    def __init__(
        self,
        store: RedisBlockStore,
        *,
        layer_names: Sequence[str],
        num_blocks: int,
        block_size: int,
        max_pending_bytes: int,
    ) -> None:
        self._store = store
        self._layer_names = list(layer_names)
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._max_pending = max_pending_bytes
        self._layers: list[torch.Tensor] = []
        self._block_dim = 0
        self._block_shape: tuple[int, ...] = ()
        self._dtype = torch.float32
        self.block_bytes = 0
        self._header = store.header()
        self._errors: set[int] = set()
        self._fetcher = ThreadPoolExecutor(1, thread_name_prefix="kv-fetch")
        self._queue: queue.Queue[tuple[list[bytes], torch.Tensor] | None] = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._writer.start()

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        layers = [kv_caches[name] for name in self._layer_names]
        first = layers[0]
        dims = [d for d in (0, 1) if first.shape[d] == self._num_blocks]
        if not dims or any(t.shape != first.shape or t.dtype != first.dtype for t in layers):
            raise ValueError(
                f"KV cache layout not understood: {tuple(first.shape)} for "
                f"{self._num_blocks} blocks"
            )
        self._block_dim = dims[0]
        self._block_shape = tuple(s for d, s in enumerate(first.shape) if d != self._block_dim)
        self._dtype = first.dtype
        self._layers = layers
        per_layer = int(np.prod(self._block_shape)) * first.element_size()
        self.block_bytes = per_layer * len(layers)
        log.info(
            "kv mover: %d layers, block %s %s (dim %d), %d bytes per block",
            len(layers),
            self._block_shape,
            self._dtype,
            self._block_dim,
            self.block_bytes,
        )

    # ---- load --------------------------------------------------------------------------

    def load(self, block_ids: Sequence[int], hashes: Sequence[bytes]) -> None:
        """Copy stored blocks into the cache; blocks from the first bad one on are errors."""
        started = time.perf_counter()
        chunks = [
            (block_ids[i : i + LOAD_CHUNK_BLOCKS], hashes[i : i + LOAD_CHUNK_BLOCKS])
            for i in range(0, len(block_ids), LOAD_CHUNK_BLOCKS)
        ]
        loaded = 0
        failed_at: int | None = None
        nxt: Future[list[bytes | None]] | None = self._fetcher.submit(
            self._store.get_many, chunks[0][1]
        )
        for i, (ids, _) in enumerate(chunks):
            assert nxt is not None
            values = nxt.result()
            nxt = (
                self._fetcher.submit(self._store.get_many, chunks[i + 1][1])
                if (i + 1 < len(chunks))
                else None
            )
            good = self._valid_prefix(values)
            if good:
                self._inject(ids[:good], values[:good])
                loaded += good
            if good < len(ids):
                failed_at = i * LOAD_CHUNK_BLOCKS + good
                break
        if nxt is not None:
            nxt.cancel()
        touched = [(h, len(self._header) + self.block_bytes) for h in hashes[:loaded]]
        stats = {"blocks_loaded": loaded, "bytes_loaded": loaded * self.block_bytes}
        if failed_at is not None:
            self._errors.update(block_ids[failed_at:])
            stats["load_failures"] = 1
            log.warning(
                "kv load: %d of %d blocks missing or invalid; vLLM recomputes them",
                len(block_ids) - failed_at,
                len(block_ids),
            )
        stats["load_us"] = int((time.perf_counter() - started) * 1e6)
        self._enqueue_side_work(touched, stats)

    def _valid_prefix(self, values: Sequence[bytes | None]) -> int:
        expected = len(self._header) + self.block_bytes
        for n, value in enumerate(values):
            if value is None or len(value) != expected or not value.startswith(self._header):
                return n
        return len(values)

    def _inject(self, block_ids: Sequence[int], values: Sequence[bytes | None]) -> None:
        n, hdr = len(block_ids), len(self._header)
        flat = torch.empty(n * self.block_bytes, dtype=torch.uint8)
        view = flat.numpy()
        for i, value in enumerate(values):
            assert value is not None
            view[i * self.block_bytes : (i + 1) * self.block_bytes] = np.frombuffer(
                value, dtype=np.uint8, offset=hdr
            )
        blocks = flat.view(self._dtype).view(n, len(self._layers), *self._block_shape)
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self._layers[0].device)
        for layer, cache in enumerate(self._layers):
            src = blocks[:, layer].to(cache.device).movedim(0, self._block_dim)
            cache.index_copy_(self._block_dim, index, src)

    def take_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    # ---- save --------------------------------------------------------------------------

    def save(self, block_ids: Sequence[int], hashes: Sequence[bytes]) -> None:
        """Copy the blocks out now (the cache may reuse them); write them in the background."""
        if not block_ids or not self._layers:
            return
        size = len(block_ids) * self.block_bytes
        with self._lock:
            if self._pending + size > self._max_pending or not self._store.available:
                self._count({"saves_dropped": len(block_ids)})
                return
            self._pending += size
        started = time.perf_counter()
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self._layers[0].device)
        copy = torch.stack(
            [
                c.index_select(self._block_dim, index).movedim(self._block_dim, 0)
                for c in self._layers
            ],
            dim=1,
        ).cpu()
        self._count({"save_copy_us": int((time.perf_counter() - started) * 1e6)})
        self._queue.put((list(hashes), copy))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            hashes, blocks = item
            try:
                self._write(hashes, blocks)
            except Exception:  # the writer must outlive any one bad batch
                log.exception("kv writer: batch failed")
            finally:
                with self._lock:
                    self._pending -= len(hashes) * self.block_bytes

    def _write(self, hashes: list[bytes], blocks: torch.Tensor) -> None:
        batch: list[tuple[bytes, bytes]] = []
        batch_bytes = 0
        for h, block in zip(hashes, blocks, strict=True):
            value = self._header + block.contiguous().view(torch.uint8).numpy().tobytes()
            batch.append((h, value))
            batch_bytes += len(value)
            if batch_bytes >= WRITE_BATCH_BYTES:
                self._store.put_many(batch)
                batch, batch_bytes = [], 0
        self._store.put_many(batch)

    # ---- side work (stats, LRU touches) goes through the writer thread -------------------

    def _count(self, stats: dict[str, int]) -> None:
        self._enqueue_side_work([], stats)

    def _enqueue_side_work(self, touched: list[tuple[bytes, int]], stats: dict[str, int]) -> None:
        self._fetcher.submit(self._side_work, touched, stats)

    def _side_work(self, touched: list[tuple[bytes, int]], stats: dict[str, int]) -> None:
        if touched:
            self._store.touch(touched)
        self._store.add_stats(stats)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until queued writes are done (tests and shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._pending == 0 and self._queue.empty():
                    return
            time.sleep(0.01)

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._writer.join(timeout=5)
        self._fetcher.shutdown(wait=True)
