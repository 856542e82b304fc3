"""Prompt-lookup (n-gram) speculative decoding (`engine.speculative: ngram`) changes how fast
greedy text comes, never the text: a server with it on answers exactly as a server of the same
model without it, on the tiny model (with KV snapshots on, as ``tiny_server``) and on SmolLM2,
float32. The prompts repeat a passage (and the tiny model, random, repeats itself), so drafts are
proposed and accepted; vLLM's own counters, on the server's /metrics, show that they were.

The SmolLM2 server with drafts goes on to test_engine_death.py, which comes after this module and
kills its engine core mid-stream (``drafting_smollm2_start``)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.drafts import accepted_drafts
from tests.support.server import ServerProcess

PASSAGE = (
    "Every event is written to Redis with an increasing id before any client sees it, so a "
    "client that drops reconnects with Last-Event-ID and continues: nothing lost, nothing "
    "repeated, identical text. "
)
PROMPTS = [
    f"{PASSAGE * 3}Repeat the passage above word for word: {PASSAGE[:60]}",
    f"Notes: {PASSAGE}{PASSAGE}Summary of the notes: Every event",
    "alpha beta gamma delta " * 20,  # the random tiny model falls into a loop: drafts hit
]
CHAT = "Copy this sentence exactly, twice:\n" + PASSAGE


def _generate(server: ServerProcess, body: dict[str, object]) -> dict[str, object]:
    request = {"max_tokens": 96, "temperature": 0, "stream": False, **body}
    r = httpx.post(f"{server.url}/v1/generate", json=request, timeout=600)
    r.raise_for_status()
    answer: dict[str, object] = r.json()
    return answer


@pytest.fixture(scope="module")
def drafting_tiny(drafting_tiny_start: ServerProcess) -> ServerProcess:
    drafting_tiny_start.wait_ready()
    return drafting_tiny_start


@pytest.fixture(scope="module")
def drafting_smollm2(drafting_smollm2_start: ServerProcess) -> ServerProcess:
    drafting_smollm2_start.wait_ready()
    return drafting_smollm2_start


def test_greedy_text_on_the_tiny_model_is_the_same_with_drafts(
    drafting_tiny: ServerProcess, tiny_server: ServerProcess
) -> None:
    speculative = drafting_tiny
    before = accepted_drafts(speculative.url)
    for prompt in PROMPTS:
        plain = _generate(tiny_server, {"prompt": prompt})
        drafted = _generate(speculative, {"prompt": prompt})
        assert drafted["token_ids"] == plain["token_ids"], prompt
        assert drafted["text"] == plain["text"]
    assert accepted_drafts(speculative.url) > before  # drafts were made, and some kept


def test_greedy_text_on_smollm2_is_the_same_with_drafts(
    drafting_smollm2: ServerProcess, smollm2_server: ServerProcess
) -> None:
    speculative = drafting_smollm2
    before = accepted_drafts(speculative.url)
    for body in ({"prompt": CHAT, "chat": True}, {"prompt": PROMPTS[0]}):
        plain = _generate(smollm2_server, body)
        drafted = _generate(speculative, body)
        assert drafted["token_ids"] == plain["token_ids"], body
        assert drafted["text"] == plain["text"]
    assert accepted_drafts(speculative.url) > before
