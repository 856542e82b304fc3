"""Knowledge-base helpers for tests that talk to a real server."""

from __future__ import annotations

import uuid

import httpx


def make_kb(base_url: str, documents: list[tuple[str, str]], prefix: str = "kb") -> str:
    """Create a knowledge base holding (title, text) documents; return its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=base_url, timeout=300) as client:
        client.post("/v1/kbs", json={"name": name}).raise_for_status()
        for title, text in documents:
            r = client.post(f"/v1/kbs/{name}/documents", json={"title": title, "text": text})
            r.raise_for_status()
    return name
