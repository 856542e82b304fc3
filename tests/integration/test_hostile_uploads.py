"""Hostile uploads get a clear 413 or 422 in bounded time, and leave the service answering.

Through ``parse_upload`` (what the upload route and the CLI call: a real worker process, small
limits so the budgets are seconds) and through the HTTP API of the service in the test process
(tests/support/inprocess.py; the default limits: 20 s, 2,000,000 characters). The files are
built in tests/support/pdfs.py.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rag_stream.errors import InvalidRequest, PayloadTooLarge
from rag_stream.ingest.documents import parse_upload
from rag_stream.ingest.files import ingest_files
from rag_stream.ingest.parse_worker import READY, Job
from rag_stream.ingest.parsing import PDF
from rag_stream.settings import IngestSettings
from tests.support.inprocess import InProcess
from tests.support.pdfs import (
    encrypted_pdf,
    make_pdf,
    nested_arrays_pdf,
    shared_content_pdf,
    show_text,
    slow_blank_pdf,
    text_bomb_pdf,
    zeros_bomb_pdf,
)

TIGHT = IngestSettings(parse_timeout_s=2, max_text_chars=100_000)
NORMAL_TEXT = "Alpha page talks about apples.\n\nBeta page about bananas."
ENCRYPTION = "the PDF uses an encryption this server cannot read; upload an unencrypted copy"

# (file, status, the error message); each is answered in well under a second of parsing.
REFUSED = {
    "unknown-security-handler": (encrypted_pdf(handler=b"AdobePPK"), 422, ENCRYPTION),
    "encryption-V9": (encrypted_pdf(version=9), 422, ENCRYPTION),
    "200k-nested-arrays": (nested_arrays_pdf(), 422, "the PDF is nested too deeply to parse"),
    "5MB-of-zeros": (
        zeros_bomb_pdf(5_000_000),
        422,
        "PDF has no extractable text (1 page(s)); scanned documents need OCR before upload",
    ),
    "pages-sharing-a-stream": (
        shared_content_pdf(show_text("A" * 4000), pages=600),
        413,
        "the PDF has more text than the limit of 2000000 characters (reached on page 500 of 600)",
    ),
}


def normal_pdf() -> bytes:
    return make_pdf("Alpha page talks about apples.", "Beta page about bananas.")


# parse_upload


@pytest.mark.parametrize(("name"), list(REFUSED))
async def test_hostile_pdfs_get_a_4xx_naming_the_problem(name: str) -> None:
    pdf, status, message = REFUSED[name]
    began = time.monotonic()
    with pytest.raises((InvalidRequest, PayloadTooLarge)) as caught:
        await parse_upload(pdf, f"{name}.pdf", None)
    assert (caught.value.status_code, caught.value.message) == (status, message)
    assert time.monotonic() - began < 15  # a worker start on a loaded machine, then < 2 s


async def test_a_text_bomb_is_killed_at_its_time_budget_and_the_next_upload_parses() -> None:
    bomb = text_bomb_pdf(700_000)  # ~8 KB inflating to 4.9 MB: ~30 s and 240 MB in pypdf
    assert len(bomb) < 10_000
    await parse_upload(normal_pdf(), "warm.pdf", None, TIGHT)  # the worker start is not timed
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await anyio.sleep(0.05)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(tick)
        began = time.monotonic()
        with pytest.raises(InvalidRequest) as caught:
            await parse_upload(bomb, "bomb.pdf", None, TIGHT)
        took = time.monotonic() - began
        tasks.cancel_scope.cancel()
    assert caught.value.message == "the PDF took longer than 2 s to parse"
    assert took < TIGHT.parse_timeout_s + 5
    assert max(gaps) < 0.5  # the event loop kept running meanwhile
    # The killed worker is replaced: the next upload parses, with the same text as ever.
    assert (await parse_upload(normal_pdf(), "after.pdf", None, TIGHT)).text == NORMAL_TEXT


async def test_a_parse_over_its_memory_limit_is_a_422() -> None:
    limits = IngestSettings(parse_timeout_s=120, parse_memory_mb=256)
    with pytest.raises(InvalidRequest) as caught:
        await parse_upload(text_bomb_pdf(1_500_000), "bomb.pdf", None, limits)
    assert caught.value.message == "the PDF needs more than 256 MB of memory to parse"
    assert (await parse_upload(normal_pdf(), "after.pdf", None, limits)).text == NORMAL_TEXT


async def test_pages_sharing_one_stream_stop_early_at_the_text_limit() -> None:
    began = time.monotonic()
    with pytest.raises(PayloadTooLarge) as caught:
        await parse_upload(shared_content_pdf(show_text("A" * 4000), 600), "x.pdf", None, TIGHT)
    assert caught.value.message.endswith("(reached on page 25 of 600)")
    assert time.monotonic() - began < TIGHT.parse_timeout_s


async def test_text_files_go_through_the_same_limits() -> None:
    with pytest.raises(PayloadTooLarge) as caught:
        await parse_upload(b"a" * 100_001, "big.txt", None, TIGHT)
    assert caught.value.message == "the text file has more text than the limit of 100000 characters"
    parsed = await parse_upload(b"# Notes\n\nshort", "notes.md", None, TIGHT)
    assert (parsed.text, parsed.title) == ("# Notes\n\nshort", "Notes")


async def test_text_cut_into_too_many_blocks_is_refused_not_shipped() -> None:
    # 28,000 characters of text, but 9,000 blocks each naming a 512-character section: a reply
    # of megabytes (gigabytes at the default text limit) for the API process to read.
    html = "<h1>" + "H" * 600 + "</h1>" + "<p>a</p>" * 9000
    limits = IngestSettings(max_text_chars=30_000)
    with pytest.raises(PayloadTooLarge) as caught:
        await parse_upload(html.encode(), "page.html", None, limits)
    assert caught.value.message == "the HTML document has too many paragraphs and headings to index"


def test_a_worker_left_by_its_parent_stops_at_its_own_cpu_limit() -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "rag_stream.ingest.parse_worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert worker.stdin is not None and worker.stdout is not None
    try:
        assert worker.stdout.readline() == READY
        slow = slow_blank_pdf(pages=100)  # minutes of parsing
        job = Job(media_type=PDF, size=len(slow), max_text_chars=1000, memory_mb=1024, timeout_s=1)
        header = job.model_dump_json().encode()
        worker.stdin.write(len(header).to_bytes(4, "big") + header + slow)
        worker.stdin.close()  # the parent is gone: nobody will kill this worker
        # CPU limit: the 1 s budget + 5 s of grace + what the worker had used to start.
        assert worker.wait(timeout=60) == -signal.SIGXCPU
    finally:
        worker.kill()
        worker.wait()


class RecordingIngestor:
    """Stands in for the Ingestor: keeps the drafts ``ingest_files`` hands over."""

    def __init__(self) -> None:
        self.titles: list[str] = []

    def batch(
        self, kb_id: str, on_outcome: Any, on_chunks: Any = None, embedder: Any = None
    ) -> RecordingIngestor:
        return self

    async def __aenter__(self) -> RecordingIngestor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def add(self, draft: Any, tag: Any = None) -> None:
        self.titles.append(draft.title)


async def test_cli_ingest_reports_a_file_over_the_text_limit_and_goes_on(tmp_path: Path) -> None:
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    big.write_bytes(b"a" * 100_001)  # the run stopped with a traceback before
    small.write_bytes(b"small")
    ingestor: Any = RecordingIngestor()
    ingestor.settings = TIGHT
    summary = await ingest_files(ingestor, "kb", [big, small], str)
    assert [(path.name, message) for path, message in summary.failed] == [
        ("big.txt", "the text file has more text than the limit of 100000 characters")
    ]
    assert ingestor.titles == ["small"]


# The HTTP API


@pytest.fixture
def client(in_process_module: InProcess) -> httpx.AsyncClient:
    return in_process_module.client


@pytest.fixture
async def kb(client: httpx.AsyncClient) -> str:
    r = await client.post("/v1/kbs", json={"name": f"hostile-{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    return str(r.json()["name"])


async def upload(client: httpx.AsyncClient, kb: str, name: str, data: bytes) -> httpx.Response:
    return await client.post(f"/v1/kbs/{kb}/documents", files={"file": (name, data, None)})


@pytest.mark.parametrize(("name"), list(REFUSED))
async def test_hostile_pdfs_are_refused_over_http(
    client: httpx.AsyncClient, kb: str, name: str
) -> None:
    pdf, status, message = REFUSED[name]
    began = time.monotonic()
    r = await upload(client, kb, f"{name}.pdf", pdf)
    assert time.monotonic() - began < 15
    assert r.status_code == status, r.text
    code = "payload_too_large" if status == 413 else "invalid_request"
    assert r.json() == {
        "error": {"code": code, "message": message, "type": "invalid_request_error", "param": None}
    }


async def test_a_slow_pdf_is_stopped_at_20_s_while_the_server_keeps_answering(
    client: httpx.AsyncClient, kb: str
) -> None:
    # 2 KB; each of its 100 pages costs pypdf over a second (in little memory) and shows nothing
    slow = slow_blank_pdf(pages=100)
    warm = await upload(client, kb, "warm.pdf", make_pdf("Warm-up."))
    assert warm.status_code == 201  # a warm worker
    began = time.monotonic()
    pending = asyncio.create_task(upload(client, kb, "slow.pdf", slow))
    health: list[float] = []
    while not pending.done():
        asked = time.monotonic()
        assert (await client.get("/healthz", timeout=5)).status_code == 200
        health.append(time.monotonic() - asked)
        await asyncio.sleep(0.2)
    r = await pending
    took = time.monotonic() - began
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"] == "the PDF took longer than 20 s to parse"
    assert 20 <= took < 25
    assert len(health) > 50 and max(health) < 1.0
    # The next upload gets a fresh worker and the same text as before.
    again = await upload(client, kb, "fruit.pdf", normal_pdf())
    assert again.status_code == 201, again.text
    doc = (await client.get(f"/v1/kbs/{kb}/documents/{again.json()['id']}")).json()
    assert doc["text"] == NORMAL_TEXT
