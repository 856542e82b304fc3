"""Knowledge-base helpers for tests that talk to a real server."""

from __future__ import annotations

import uuid

import httpx

from tests.support.waiting import eventually_sync


def make_kb(base_url: str, documents: list[tuple[str, str]], prefix: str = "kb") -> str:
    """Create a knowledge base holding (title, text) documents; return its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=base_url, timeout=300) as client:
        client.post("/v1/kbs", json={"name": name}).raise_for_status()
        for title, text in documents:
            r = client.post(f"/v1/kbs/{name}/documents", json={"title": title, "text": text})
            r.raise_for_status()
            if r.status_code == 202:  # a long text, ingested in the background
                wait_until_ready(client, name, r.json()["id"])
    return name


def wait_until_ready(client: httpx.Client, kb: str, doc: str, timeout_s: float = 300) -> None:
    """Wait for a document ingested in the background to be searchable (a failure raises)."""

    def ready() -> bool:
        status = client.get(f"/v1/kbs/{kb}/documents/{doc}").json()["status"]
        assert status != "failed", f"the ingest of {doc} failed"
        return bool(status == "ready")

    eventually_sync(ready, f"document {doc} ingested", timeout_s=timeout_s, every_s=0.2)
