"""Block keys: chained hashes of full blocks, and the engine-layout namespace."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rag_stream.kv.keys import block_hashes, chain_seed, extend_chain, namespace

SEED = chain_seed("ns")


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(list(range(300)), 128, SEED)) == 2
    assert block_hashes(list(range(127)), 128, SEED) == []


def test_a_block_key_depends_on_every_token_before_it() -> None:
    tokens = list(range(1000, 1400))
    changed = tokens.copy()
    changed[200] += 1  # inside the second block
    a, b = block_hashes(tokens, 128, SEED), block_hashes(changed, 128, SEED)
    assert a[0] == b[0]
    assert a[1] != b[1] and a[2] != b[2]


def test_shared_prefix_gives_shared_keys() -> None:
    prompt = list(range(5000, 5256))
    a = block_hashes([*prompt, 1, 2, 3], 128, SEED)
    b = block_hashes([*prompt, 7, 8, 9], 128, SEED)
    assert a == b


def test_growing_the_chain_step_by_step_equals_hashing_at_once() -> None:
    tokens = list(range(700))
    grown: list[bytes] = []
    for n in (1, 3, 5):
        extend_chain(grown, tokens, 128, SEED, n)
    assert grown == block_hashes(tokens, 128, SEED)


def test_namespace_and_salt_separate_chains() -> None:
    tokens = list(range(256))
    assert block_hashes(tokens, 128, chain_seed("a")) != block_hashes(tokens, 128, chain_seed("b"))
    assert block_hashes(tokens, 128, chain_seed("a", "tenant-1")) != block_hashes(
        tokens, 128, chain_seed("a")
    )


def _layout(**change: Any) -> dict[str, object]:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from rag_stream.kv.connector import layout_of

    params: dict[str, Any] = {
        "model": "/models/tiny",
        "dtype": torch.float32,
        "block_size": 128,
        "kv_heads": 1,
        "head_size": 64,
        "layers": ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
        "tp": 1,
    }
    params.update(change)
    spec = FullAttentionSpec(
        block_size=params["block_size"],
        num_kv_heads=params["kv_heads"],
        head_size=params["head_size"],
        dtype=params["dtype"],
    )
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(model=params["model"], revision=None, dtype=params["dtype"]),
        cache_config=SimpleNamespace(cache_dtype="auto", block_size=params["block_size"]),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=params["tp"], pipeline_parallel_size=1
        ),
    )
    group = SimpleNamespace(layer_names=params["layers"], kv_cache_spec=spec)
    return layout_of(vllm_config, SimpleNamespace(kv_cache_groups=[group]))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"model": "/models/other"},
        {"block_size": 64},
        {"kv_heads": 2},
        {"head_size": 128},
        {"layers": ["model.layers.0.self_attn.attn"]},
        {"dtype": "bfloat16"},
    ],
)
def test_any_layout_change_gives_another_namespace(change: dict[str, Any]) -> None:
    import torch

    if change.get("dtype") == "bfloat16":
        change = {"dtype": torch.bfloat16}
    assert namespace(_layout(**change)) != namespace(_layout())


def test_same_layout_same_namespace() -> None:
    assert namespace(_layout()) == namespace(_layout())


def test_more_than_one_worker_is_refused() -> None:
    with pytest.raises(ValueError, match="one worker"):
        _layout(tp=2)
