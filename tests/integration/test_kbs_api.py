"""The knowledge-base HTTP API on the service in the test process (tests/support/inprocess.py:
SQLite, the vector store under its data dir, the real embedder)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.support.inprocess import InProcess
from tests.support.pdfs import blank_pdf, make_pdf

UPLOAD_LIMIT = 64 * 1024
NOTES = (
    "# Field notes\n\nThe heron waits motionless in shallow water before it strikes.\n\n"
    "## Owls\n\nBarn owls hunt by sound alone; their facial disc funnels it to the ears.\n"
)

pytestmark = pytest.mark.in_process(
    ingest__max_upload_bytes=UPLOAD_LIMIT,
    ingest__chunk_tokens=64,
    ingest__chunk_overlap=8,
    # concurrent uploads of one tenant (test_concurrent_uploads_of_the_same_document_make_one)
    ingest__max_active_per_tenant=8,
    ingest__max_active=8,
)


@pytest.fixture
def client(in_process_module: InProcess) -> httpx.AsyncClient:
    return in_process_module.client


@pytest.fixture
async def kb(client: httpx.AsyncClient) -> str:
    r = await client.post("/v1/kbs", json={"name": f"kb-{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    return str(r.json()["name"])


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


async def upload(
    client: httpx.AsyncClient, kb: str, name: str, data: bytes, ctype: str = "", **fields: str
) -> httpx.Response:
    return await client.post(
        f"/v1/kbs/{kb}/documents", files={"file": (name, data, ctype or None)}, data=fields
    )


async def test_kb_lifecycle(client: httpx.AsyncClient) -> None:
    name = f"lib-{uuid.uuid4().hex[:8]}"
    created = await client.post("/v1/kbs", json={"name": name, "description": "birds"})
    assert created.status_code == 201
    kb = created.json()
    assert kb["name"] == name and kb["document_count"] == 0
    assert error_of(await client.post("/v1/kbs", json={"name": name}), 409)["code"] == "conflict"
    assert (await client.get(f"/v1/kbs/{name}")).json()["id"] == kb["id"]
    # ids are stable refs too
    assert (await client.get(f"/v1/kbs/{kb['id']}")).json()["name"] == name
    assert name in [k["name"] for k in (await client.get("/v1/kbs")).json()["data"]]
    doc = (
        await client.post(f"/v1/kbs/{name}/documents", json={"title": "n", "text": NOTES})
    ).json()
    assert (await client.get(f"/v1/kbs/{name}")).json()["document_count"] == 1
    assert (await client.delete(f"/v1/kbs/{name}")).status_code == 204
    assert error_of(await client.get(f"/v1/kbs/{name}"), 404)["code"] == "not_found"
    error_of(await client.get(f"/v1/kbs/{kb['id']}/documents/{doc['id']}"), 404)
    error_of(await client.post(f"/v1/kbs/{name}/search", json={"query": "owls"}), 404)
    error_of(await client.post("/v1/kbs", json={"name": "has space"}), 422)


async def test_json_document_round_trip_with_citable_chunks(
    client: httpx.AsyncClient, kb: str
) -> None:
    body = {"title": "Field notes", "text": NOTES, "media_type": "text/markdown",
            "metadata": {"lang": "en"}, "source": "notes.md"}  # fmt: skip
    r = await client.post(f"/v1/kbs/{kb}/documents", json=body)
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["created"] is True and doc["metadata"] == {"lang": "en"}
    again = await client.post(f"/v1/kbs/{kb}/documents", json=body)
    assert again.status_code == 200 and again.json()["id"] == doc["id"]
    assert again.json()["created"] is False
    detail = await client.get(
        f"/v1/kbs/{kb}/documents/{doc['id']}", params={"include_chunks": True}
    )
    full = detail.json()
    assert full["text"] == NOTES
    assert [c["heading"] for c in full["chunks"]] == ["Field notes", "Owls"]
    for chunk in full["chunks"]:
        assert full["text"][chunk["start"] : chunk["end"]] == chunk["text"]

    found = (
        await client.post(f"/v1/kbs/{kb}/search", json={"query": "how do owls hunt", "top_k": 1})
    ).json()["results"]
    hit = found[0]
    assert set(hit) == {"chunk_id", "document_id", "title", "heading", "text", "start", "end",
                        "score"}  # fmt: skip
    assert hit["document_id"] == doc["id"] and hit["heading"] == "Owls"
    assert hit["title"] == "Field notes" and "Barn owls" in hit["text"]
    assert NOTES[hit["start"] : hit["end"]] == hit["text"]
    filtered = await client.post(
        f"/v1/kbs/{kb}/search", json={"query": "owls", "filter": {"lang": "de"}}
    )
    assert filtered.json()["results"] == []

    assert (await client.delete(f"/v1/kbs/{kb}/documents/{doc['id']}")).status_code == 204
    error_of(await client.get(f"/v1/kbs/{kb}/documents/{doc['id']}"), 404)
    error_of(await client.delete(f"/v1/kbs/{kb}/documents/{doc['id']}"), 404)
    searched = await client.post(f"/v1/kbs/{kb}/search", json={"query": "owls"})
    assert searched.json()["results"] == []


@pytest.mark.parametrize(
    ("name", "data", "heading"),
    [
        ("owls.txt", b"Barn owls hunt by sound alone in total darkness.", None),
        ("owls.md", b"# Owls\n\nBarn owls hunt by sound alone in total darkness.", "Owls"),
        ("owls.html", b"<h2>Owls</h2><p>Barn owls hunt by <i>sound</i> alone.</p>", "Owls"),
        ("owls.pdf", make_pdf("Barn owls hunt by sound alone in total darkness."), "page 1"),
    ],
)
async def test_file_uploads_of_each_supported_type(
    client: httpx.AsyncClient, kb: str, name: str, data: bytes, heading: str | None
) -> None:
    r = await upload(client, kb, name, data, metadata='{"kind": "bird"}')
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["source"] == name and doc["metadata"] == {"kind": "bird"}
    hits = (
        await client.post(
            f"/v1/kbs/{kb}/search",
            json={"query": "owl hunting by sound", "filter": {"kind": "bird"}},
        )
    ).json()["results"]
    assert hits[0]["document_id"] == doc["id"] and hits[0]["heading"] == heading
    assert "owls hunt by" in hits[0]["text"]


async def test_reupload_of_the_same_file_replaces_it(client: httpx.AsyncClient, kb: str) -> None:
    first = (await upload(client, kb, "guide.md", b"# Guide\n\nVersion one says turn left.")).json()
    second = (
        await upload(client, kb, "guide.md", b"# Guide\n\nVersion two says turn right.")
    ).json()
    assert second["created"] and second["replaced_document_id"] == first["id"]
    listing = (await client.get(f"/v1/kbs/{kb}/documents")).json()
    assert [d["id"] for d in listing["data"]] == [second["id"]]
    error_of(await client.get(f"/v1/kbs/{kb}/documents/{first['id']}"), 404)
    hits = (await client.post(f"/v1/kbs/{kb}/search", json={"query": "which way to turn"})).json()
    assert [h["document_id"] for h in hits["results"]] == [second["id"]]


async def test_documents_are_paginated(client: httpx.AsyncClient, kb: str) -> None:
    ids = [
        (
            await client.post(
                f"/v1/kbs/{kb}/documents", json={"title": f"d{i}", "text": f"Note number {i}."}
            )
        ).json()["id"]
        for i in range(5)
    ]
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = await client.get(f"/v1/kbs/{kb}/documents", params={"limit": 2, "offset": offset})
        body = page.json()
        assert body["total"] == 5 and len(body["data"]) <= 2
        seen += [d["id"] for d in body["data"]]
        offset = body["next_offset"]
    assert seen == ids
    error_of(await client.get(f"/v1/kbs/{kb}/documents", params={"limit": 0}), 422)


async def test_bad_input_is_refused_with_the_reason(client: httpx.AsyncClient, kb: str) -> None:
    docs = f"/v1/kbs/{kb}/documents"
    empty = await client.post(docs, json={"title": "t", "text": ""})
    assert "text" in error_of(empty, 422)["message"]
    blank = await client.post(docs, json={"title": "t", "text": "  \n"})
    assert "empty" in error_of(blank, 422)["message"]
    assert error_of(await upload(client, kb, "empty.txt", b"  \n\n "), 422)["message"].endswith(
        "contains no text"
    )
    assert error_of(await upload(client, kb, "a.docx", b"PK\x03\x04"), 415)["code"] == (
        "unsupported_media_type"
    )
    error_of(await upload(client, kb, "pic", b"\x89PNG", "image/png"), 415)
    error_of(await client.post(docs, content=b"hello", headers={"content-type": "text/csv"}), 415)
    latin1 = "café crème".encode("latin-1")
    bad_utf8 = error_of(await upload(client, kb, "latin1.txt", latin1), 422)
    assert "not valid UTF-8" in bad_utf8["message"] and "0xe9" in bad_utf8["message"]
    no_text = error_of(await upload(client, kb, "scan.pdf", blank_pdf()), 422)
    assert "PDF has no extractable text" in no_text["message"]
    error_of(await upload(client, kb, "x.txt", b"ok", metadata="[1, 2]"), 422)
    error_of(
        await client.post("/v1/kbs/no-such-kb/documents", json={"title": "t", "text": "x"}), 404
    )
    error_of(await client.get(f"/v1/kbs/{kb}/documents/{'0' * 32}"), 404)
    error_of(await client.post(f"/v1/kbs/{kb}/search", json={"query": "  "}), 422)
    assert (await client.get(f"/v1/kbs/{kb}")).json()["document_count"] == 0


async def test_uploads_over_the_size_limit_are_refused(client: httpx.AsyncClient, kb: str) -> None:
    big = b"word " * (UPLOAD_LIMIT // 5 + 100)
    assert error_of(await upload(client, kb, "big.txt", big), 413)["code"] == "payload_too_large"
    big_json = {"title": "t", "text": big.decode()}
    error_of(await client.post(f"/v1/kbs/{kb}/documents", json=big_json), 413)

    # A chunked body has no Content-Length: the limit is counted while reading.
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"title": "t", "text": "'
        for _ in range(UPLOAD_LIMIT // 1024 + 2):
            yield b"a" * 1024
        yield b'"}'

    streamed = await client.post(
        f"/v1/kbs/{kb}/documents", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in streamed.request.headers
    error_of(streamed, 413)
    ok = await upload(client, kb, "small.txt", b"word " * 100)
    assert ok.status_code == 201
    assert (await client.get(f"/v1/kbs/{kb}")).json()["document_count"] == 1


async def test_concurrent_uploads_of_the_same_document_make_one(
    client: httpx.AsyncClient, kb: str
) -> None:
    data = ("Swifts sleep on the wing. " * 40).encode()
    responses = await asyncio.gather(*(upload(client, kb, "swifts.txt", data) for _ in range(6)))
    assert all(r.status_code in (200, 201) for r in responses), [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.json()["created"] for r in responses) == 1
    listing = (await client.get(f"/v1/kbs/{kb}/documents")).json()
    assert listing["total"] == 1
