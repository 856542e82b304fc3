"""How many drafted tokens a server's engine accepted (prompt-lookup speculative decoding), from
vLLM's own counter on the server's /metrics: proof that drafts were made and kept."""

from __future__ import annotations

import re

import httpx


def accepted_drafts(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = re.findall(
        r"^vllm:spec_decode_num_accepted_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M
    )
    return sum(float(v) for v in found)
