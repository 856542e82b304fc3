"""The onnx embedder backend: the export prepare-models made loads and gives torch's vectors.

Every stored vector came from one backend and every query may come from the other (the
default takes onnx when it can), so they must agree: English, Chinese, a text past the model's
256 tokens (truncated), and a batch of mixed lengths (padded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_stream.errors import ConfigError
from rag_stream.retrieval.embedder import ONNX_MAX_TEXTS, SentenceTransformerEmbedder
from rag_stream.retrieval.onnx_model import onnx_file

TEXTS = [
    "How do I resume a stream after the connection drops?",
    "如何在连接断开后恢复一个流？",
    "Redis keeps every event before a client sees it; 事件先写入 Redis。",
    " ".join(["the harbour master logs each ship that enters"] * 60),  # > 256 tokens
    "ok",
]


async def test_onnx_backend_embeds_as_torch_does(embedder_path: Path) -> None:
    assert onnx_file(embedder_path).exists(), "prepare-models did not export the embedder"
    onnx = await SentenceTransformerEmbedder.load(str(embedder_path), backend="onnx")
    torch = await SentenceTransformerEmbedder.load(str(embedder_path), backend="torch")

    batch = await onnx.embed(TEXTS)
    reference = await torch.embed(TEXTS)

    assert batch.shape == (len(TEXTS), torch.dimension)
    assert batch.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    assert ((batch * reference).sum(axis=1) >= 0.9999).all()
    one_by_one = np.vstack([await onnx.embed([t]) for t in TEXTS])
    assert ((one_by_one * reference).sum(axis=1) >= 0.9999).all()


@pytest.fixture
def bare_model(embedder_path: Path, tmp_path: Path) -> Path:
    """The same model without its export, as a model of the user's own would come."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for item in embedder_path.iterdir():
        if item.name != "onnx":
            (bare / item.name).symlink_to(item)
    return bare


async def test_auto_takes_onnx_with_an_export_and_torch_without(
    embedder_path: Path, bare_model: Path
) -> None:
    exported = await SentenceTransformerEmbedder.load(str(embedder_path), backend="auto")
    assert exported.backend == "onnx"
    auto = await SentenceTransformerEmbedder.load(str(bare_model), backend="auto")
    assert auto.backend == "torch"
    agreement = (await auto.embed(TEXTS[:2])) * (await exported.embed(TEXTS[:2]))
    assert agreement.sum(axis=1).min() >= 0.9999
    with pytest.raises(ConfigError, match="prepare-models"):
        await SentenceTransformerEmbedder.load(str(bare_model), backend="onnx")


async def test_only_small_calls_run_on_onnx_runtime(embedder_path: Path) -> None:
    """Ingestion's batches stay on torch: ONNX Runtime's arena would keep their peak (+1.2 GB
    after one batch of 64 long chunks, measured)."""
    embedder = await SentenceTransformerEmbedder.load(str(embedder_path), backend="onnx")
    runs: list[int] = []
    onnx = embedder._onnx
    assert onnx is not None

    class Counting:
        def __call__(self, batch: dict[str, Any]) -> Any:
            runs.append(len(batch["input_ids"]))
            return onnx(batch)

    embedder._onnx = Counting()  # type: ignore[assignment]
    small = await embedder.embed(TEXTS[:2] * 4)
    large = await embedder.embed(TEXTS[:2] * 5)
    assert runs == [ONNX_MAX_TEXTS]
    assert ((small[:2] * large[:2]).sum(axis=1) >= 0.9999).all()
