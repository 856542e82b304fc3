"""The onnx embedder backend (no torch): the export prepare-models made loads and gives torch's
vectors.

Every stored vector came from one backend and every query may come from the other (the
default takes onnx when it can), so they must agree: English, Chinese, a text past the model's
256 tokens (truncated), and a batch of mixed lengths (padded).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_stream.errors import ConfigError
from rag_stream.retrieval.embedder import load_embedder
from rag_stream.retrieval.onnx_embedder import (
    PROBE,
    REFERENCE_FILE,
    OnnxEmbedder,
    Reference,
    reference_vector,
)
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
    onnx = await load_embedder(str(embedder_path), backend="onnx")
    torch = await load_embedder(str(embedder_path), backend="torch")

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
    exported = await load_embedder(str(embedder_path), backend="auto")
    assert exported.backend == "onnx"
    auto = await load_embedder(str(bare_model), backend="auto")
    assert auto.backend == "torch"
    agreement = (await auto.embed(TEXTS[:2])) * (await exported.embed(TEXTS[:2]))
    assert agreement.sum(axis=1).min() >= 0.9999
    with pytest.raises(ConfigError, match="prepare-models"):
        await load_embedder(str(bare_model), backend="onnx")


async def test_batches_larger_than_the_batch_size_run_on_onnx_runtime_too(
    embedder_path: Path,
) -> None:
    """Ingestion's batches run on ONNX Runtime, ``batch_size`` texts a run, and give the
    vectors one text at a time gives."""
    embedder = await load_embedder(str(embedder_path), batch_size=4, backend="onnx")
    assert isinstance(embedder, OnnxEmbedder)
    runs: list[int] = []
    transformer = embedder._transformer

    def counting(batch: dict[str, Any]) -> Any:
        runs.append(len(batch["input_ids"]))
        return transformer(batch)

    embedder._transformer = counting  # type: ignore[assignment]
    vectors = await embedder.embed(TEXTS * 2)
    assert runs == [4, 4, 2]
    one = np.vstack([embedder.encode_sync([t]) for t in TEXTS])
    assert ((vectors[: len(TEXTS)] * one).sum(axis=1) >= 0.9999).all()


def _copy_model(source: Path, to: Path) -> Path:
    """The model's small files copied (their times can change), its weights linked."""
    to.mkdir()
    for item in source.rglob("*"):
        target = to / item.relative_to(source)
        if item.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif item.stat().st_size > 1_000_000:
            target.symlink_to(item)
        elif item.name != REFERENCE_FILE.name:
            shutil.copy2(item, target)
    return to


async def test_a_stale_export_is_refused_until_the_reference_is_made_again(
    embedder_path: Path, tmp_path: Path
) -> None:
    """The export is checked against sentence-transformers' vector for a probe, kept beside it
    and made again when the model's files change."""
    model = _copy_model(embedder_path, tmp_path / "model")
    good = reference_vector(model)  # made now, with torch, and saved
    saved = Reference.model_validate_json((model / REFERENCE_FILE).read_text())
    assert saved.vector == good and saved.probe == PROBE
    # the export disagrees with the reference (as an export of other weights would)
    (model / REFERENCE_FILE).write_text(
        saved.model_copy(update={"vector": [-x for x in good]}).model_dump_json()
    )
    with pytest.raises(ConfigError, match="disagrees with the model"):
        await load_embedder(str(model), backend="onnx")
    auto = await load_embedder(str(model), backend="auto")
    assert auto.backend == "torch"  # auto still starts, on torch
    # a model file changed since: the reference is made again, and the export agrees with it
    config = model / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert (await load_embedder(str(model), backend="onnx")).backend == "onnx"
    assert Reference.model_validate_json((model / REFERENCE_FILE).read_text()).vector == good


def test_the_onnx_backend_loads_no_torch(embedder_path: Path) -> None:
    """What makes a CLI or a server without a local engine start in well under a second of CPU:
    embedding, counting tokens and finding their offsets import no torch or transformers."""
    code = (
        "import asyncio, sys\n"
        "from rag_stream.retrieval.embedder import load_embedder\n"
        f"e = asyncio.run(load_embedder({str(embedder_path)!r}, backend='onnx'))\n"
        "v = asyncio.run(e.embed(['a question', '一个问题']))\n"
        "n, spans = e.count_tokens('a question'), e.token_offsets('a question')\n"
        "heavy = ('torch', 'transformers', 'sentence_transformers')\n"
        "print(e.backend, v.shape, n, spans, [m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split("\n")[-2] == "onnx (2, 384) 2 [(0, 1), (2, 10)] []", out.stdout
