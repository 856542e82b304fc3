"""The ``onnx`` embedder backend: the model's tokenizer (``tokenizers``) and its exported
transformer (ONNX Runtime), mean-pooled to unit length as the model's modules say. No torch:
a process that only embeds (a CLI, a worker, a server on a remote engine) starts in well under
a second of CPU instead of ~5 for importing sentence-transformers and torch, and holds ~190 MB
instead of ~600.

Its vectors are the ``torch`` backend's (cosine >= 0.9999 on English, Chinese, truncated and
padded texts: test_embedder_onnx.py), so chunks stored by one are found by questions embedded
by the other. ``open`` checks that on a probe sentence against a reference vector computed once
by sentence-transformers and kept next to the export (``onnx/reference.json``); the reference is
computed again when the model's files change, so a stale export is refused, not searched with.
"""

from __future__ import annotations

import copy as copy_module
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import anyio
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from rag_stream.errors import ConfigError
from rag_stream.retrieval.onnx_model import OnnxTransformer, onnx_file

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]
PROBE = "How do I resume a stream? 如何恢复一个流？"
REFERENCE_FILE = Path("onnx") / "reference.json"


class Reference(BaseModel):
    """What sentence-transformers made of ``PROBE``, and the model files it was made from."""

    files: dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns)
    probe: str
    vector: list[float]


class OnnxEmbedder:
    backend: Literal["onnx"] = "onnx"

    def __init__(self, model_dir: Path, batch_size: int = 64) -> None:
        from tokenizers import Tokenizer

        self.dimension, self.max_seq_length = _mean_pooled(model_dir)
        self._batch_size = batch_size
        # Two copies of the tokenizer, each configured once and never changed afterwards, so
        # threads may share them: model input (truncated to the model's length, padded to the
        # batch's longest) and chunking's counts and offsets (whole texts).
        path = str(model_dir / "tokenizer.json")
        self._inputs = Tokenizer.from_file(path)
        self._inputs.enable_truncation(self.max_seq_length)
        self._inputs.enable_padding()
        self._plain = Tokenizer.from_file(path)
        self._plain.no_truncation()
        self._plain.no_padding()
        self._model_file = onnx_file(model_dir)
        self._transformer = OnnxTransformer(self._model_file)

    @classmethod
    async def open(cls, model_dir: Path, batch_size: int = 64) -> OnnxEmbedder:
        """Raises ``ConfigError`` for a model this backend cannot run or a stale export."""

        def build() -> OnnxEmbedder:
            embedder = cls(model_dir, batch_size)
            embedder._check(model_dir)
            return embedder

        return await anyio.to_thread.run_sync(build)

    def _check(self, model_dir: Path) -> None:
        reference = np.asarray(reference_vector(model_dir), dtype=np.float32)
        cosine = float(self.encode_sync([PROBE])[0] @ reference)
        if cosine < 0.9999:
            raise ConfigError(
                f"the ONNX export of {model_dir} disagrees with the model (cosine {cosine:.5f}):"
                " delete its onnx/ folder and run `rag-stream prepare-models`, or set "
                "RAG_STREAM_EMBEDDER_BACKEND=torch"
            )

    def single_threaded(self) -> OnnxEmbedder:
        """A copy whose model runs on the calling thread alone (an ONNX session of its own,
        the tokenizers shared): for work that is to leave the other cores, and the CPU when
        anything else wants it, to the rest (a background ingest on a low-priority thread)."""
        copy = copy_module.copy(self)
        copy._transformer = OnnxTransformer(self._model_file, threads=1)
        return copy

    def encode_sync(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        # longest first, as sentence-transformers batches: texts of like length pad little
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        step = self._batch_size
        batches = [
            self._encode_batch([texts[i] for i in order[at : at + step]])
            for at in range(0, len(order), step)
        ]
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        vectors[order] = np.vstack(batches)
        return vectors

    def _encode_batch(self, texts: Sequence[str]) -> Vectors:
        encodings = self._inputs.encode_batch([t.strip() for t in texts])  # as s-t strips
        batch = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        hidden = self._transformer(batch)
        mask = batch["attention_mask"].astype(np.float32)[..., None]
        mean = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        norms = np.linalg.norm(mean, axis=1, keepdims=True)
        return np.asarray(mean / np.maximum(norms, 1e-12), dtype=np.float32)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return await anyio.to_thread.run_sync(self.encode_sync, texts)

    def count_tokens(self, text: str) -> int:
        return len(self._plain.encode(text, add_special_tokens=False).ids)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return [
            (int(a), int(b)) for a, b in self._plain.encode(text, add_special_tokens=False).offsets
        ]


def _mean_pooled(model_dir: Path) -> tuple[int, int]:
    """The dimension and maximum length of a sentence-transformers model made of a transformer
    and mean pooling (then, optionally, normalization), read from its files."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling = json.loads((model_dir / modules[1]["path"] / "config.json").read_text())
        config = json.loads((model_dir / "sentence_bert_config.json").read_text())
        dimension, length = int(pooling["word_embedding_dimension"]), int(config["max_seq_length"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConfigError(
            f"the onnx embedder backend cannot read {model_dir} as a sentence-transformers "
            f"model ({exc}): set RAG_STREAM_EMBEDDER_BACKEND=torch"
        ) from exc
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v is True)
    if kinds[:2] != ["Transformer", "Pooling"] or modes != ["pooling_mode_mean_tokens"]:
        raise ConfigError(
            f"the onnx embedder backend runs mean-pooled models; {model_dir} is {kinds} "
            f"(pooling {modes}): set RAG_STREAM_EMBEDDER_BACKEND=torch"
        )
    if not (model_dir / "tokenizer.json").exists():
        raise ConfigError(
            f"the onnx embedder backend needs a fast tokenizer (tokenizer.json) in {model_dir}: "
            "set RAG_STREAM_EMBEDDER_BACKEND=torch"
        )
    if not onnx_file(model_dir).exists():
        raise ConfigError(
            f"{onnx_file(model_dir)} is missing: run `rag-stream prepare-models` (it exports "
            "the default embedder) or set RAG_STREAM_EMBEDDER_BACKEND=torch"
        )
    return dimension, length


def _model_files(model_dir: Path) -> dict[str, tuple[int, int]]:
    files: dict[str, tuple[int, int]] = {}
    for path in sorted(model_dir.rglob("*")):
        relative = path.relative_to(model_dir)
        if relative.parts[0] != "onnx" and path.is_file():
            stat = path.stat()
            files[relative.as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return files


def reference_vector(model_dir: Path) -> list[float]:
    """sentence-transformers' vector for ``PROBE``: read from ``onnx/reference.json`` when it
    was made from the model's current files, else computed (torch: a few seconds) and saved."""
    path = model_dir / REFERENCE_FILE
    files = _model_files(model_dir)
    try:
        saved = Reference.model_validate_json(path.read_text())
        if saved.files == files and saved.probe == PROBE:
            return saved.vector
    except (OSError, ValueError):
        pass
    log.info("embedder: computing the ONNX export's reference vector with sentence-transformers")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    vector = model.encode([PROBE], normalize_embeddings=True, convert_to_numpy=True)[0]
    reference = Reference(files=files, probe=PROBE, vector=[float(x) for x in vector])
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # processes starting at once
    try:
        tmp.write_text(reference.model_dump_json())
        tmp.replace(path)
    except OSError as exc:  # a read-only model folder: check again next start
        log.warning("embedder: could not save %s: %s", path, exc)
    return reference.vector
