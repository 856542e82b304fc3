"""Parsing uploads into text and blocks, and refusing hostile files with a 4xx that names the
file's problem (these run ``parse`` in-process; tests/integration/test_hostile_uploads.py runs
them through the worker process and the HTTP API)."""

from __future__ import annotations

import pytest

from rag_stream.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from rag_stream.ingest.parsing import (
    HTML,
    MARKDOWN,
    PDF,
    PLAIN,
    media_type_for,
    parse,
)
from tests.support.pdfs import (
    blank_pdf,
    encrypted_pdf,
    make_pdf,
    nested_arrays_pdf,
    shared_content_pdf,
    show_text,
)


@pytest.mark.parametrize(
    ("filename", "content_type", "expected"),
    [
        ("notes.txt", None, PLAIN),
        ("README.MD", "application/octet-stream", MARKDOWN),
        ("page.htm", None, HTML),
        ("paper.pdf", None, PDF),
        ("blob", "text/markdown; charset=utf-8", MARKDOWN),
    ],
)
def test_media_type_by_suffix_then_declared_type(
    filename: str, content_type: str | None, expected: str
) -> None:
    assert media_type_for(filename, content_type) == expected


@pytest.mark.parametrize(("filename", "content_type"), [("a.docx", None), ("img", "image/png")])
def test_unsupported_types_are_refused(filename: str, content_type: str | None) -> None:
    with pytest.raises(UnsupportedMediaType, match="unsupported file type"):
        media_type_for(filename, content_type)


def test_plain_text_blocks_are_paragraphs_and_newlines_are_normalized() -> None:
    parsed = parse(b"First line\r\nsame paragraph.\r\n\r\n\r\n  Second.\x00\n", PLAIN)
    assert parsed.text == "First line\nsame paragraph.\n\n\n  Second.\n"
    assert [parsed.text[b.start : b.end] for b in parsed.blocks] == [
        "First line\nsame paragraph.",
        "Second.",
    ]


def test_invalid_utf8_names_the_byte_and_position() -> None:
    with pytest.raises(InvalidRequest, match=r"not valid UTF-8.*0xff at position 6"):
        parse(b"hello \xff world", PLAIN)


def test_markdown_keeps_the_source_and_finds_headings() -> None:
    source = "# Title\n\nIntro text.\n\n## Setup\n\n- one\n- two\n\n```\ncode\n```\n"
    parsed = parse(source.encode(), MARKDOWN)
    assert parsed.text == source
    assert parsed.title == "Title"
    spans = [(parsed.text[b.start : b.end], b.section, b.is_heading) for b in parsed.blocks]
    assert spans == [
        ("# Title", "Title", True),
        ("Intro text.", "Title", False),
        ("## Setup", "Setup", True),
        ("- one\n- two", "Setup", False),
        ("```\ncode\n```", "Setup", False),
    ]


def test_html_drops_scripts_and_marks_headings() -> None:
    html = (
        "<html><head><title>Doc title</title><script>var x = 1;</script></head><body>"
        "<h1>Main</h1><p>Hello <b>bold</b>\n world.</p><!-- note --><ul><li>one</li>"
        "<li>two</li></ul><h2>Next</h2><div>line<br>break</div></body></html>"
    )
    parsed = parse(html.encode(), HTML)
    assert parsed.title == "Doc title"
    assert "var x" not in parsed.text and "note" not in parsed.text
    blocks = [(parsed.text[b.start : b.end], b.section, b.is_heading) for b in parsed.blocks]
    assert blocks == [
        ("Main", "Main", True),
        ("Hello bold world.", "Main", False),
        ("one", "Main", False),
        ("two", "Main", False),
        ("Next", "Next", True),
        ("line\nbreak", "Next", False),
    ]


def test_pdf_text_comes_per_page() -> None:
    parsed = parse(make_pdf("Alpha page talks about apples.", "Beta page about bananas."), PDF)
    assert "apples" in parsed.text and "bananas" in parsed.text
    sections = {b.section for b in parsed.blocks}
    assert sections == {"page 1", "page 2"}
    banana = next(b for b in parsed.blocks if "bananas" in parsed.text[b.start : b.end])
    assert banana.section == "page 2"


def test_pdf_without_text_says_so() -> None:
    with pytest.raises(InvalidRequest, match="PDF has no extractable text"):
        parse(blank_pdf(), PDF)


def test_broken_pdf_is_refused_with_what_pypdf_found() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(b"%PDF-1.4 this is not really a pdf", PDF)
    assert caught.value.message == "the PDF could not be parsed: Stream has ended unexpectedly"


@pytest.mark.parametrize(
    "pdf",
    [encrypted_pdf(handler=b"AdobePPK"), encrypted_pdf(version=9)],
    ids=["unknown-security-handler", "encryption-V9"],
)
def test_pdf_encryption_pypdf_cannot_read_is_named_as_such(pdf: bytes) -> None:
    # pypdf raises NotImplementedError for both: a 500 before
    with pytest.raises(InvalidRequest) as caught:
        parse(pdf, PDF)
    assert caught.value.message == (
        "the PDF uses an encryption this server cannot read; upload an unencrypted copy"
    )


def test_pdf_nested_past_the_recursion_limit_is_refused() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(nested_arrays_pdf(200_000), PDF)  # RecursionError (a 500) before
    assert caught.value.message == "the PDF is nested too deeply to parse"


def test_pdf_text_limit_counts_the_stored_text_exactly() -> None:
    pdf = shared_content_pdf(show_text("hello there"), pages=3)
    assert len(parse(pdf, PDF, max_text_chars=37).text) == 37  # 3 * 11 + 2 * len("\n\n")
    with pytest.raises(PayloadTooLarge, match="limit of 36 characters"):
        parse(pdf, PDF, max_text_chars=36)


def test_pages_sharing_one_content_stream_stop_at_the_page_past_the_text_limit() -> None:
    # 8 KB of file, 600 pages drawing the same 4,000 characters: 2.4 M characters in all.
    pdf = shared_content_pdf(show_text("A" * 4000), pages=600)
    assert len(pdf) < 10_000
    with pytest.raises(PayloadTooLarge) as caught:
        parse(pdf, PDF, max_text_chars=100_000)
    assert caught.value.message == (
        "the PDF has more text than the limit of 100000 characters (reached on page 25 of 600)"
    )


@pytest.mark.parametrize(
    ("media_type", "source", "limit"),
    [
        (PLAIN, "a" * 1001, 1000),
        (MARKDOWN, "# Title\n\n" + "a" * 1000, 1000),
        (HTML, "<p>" + "a" * 1001 + "</p>", 1000),
    ],
)
def test_text_over_the_limit_is_refused_for_every_type(
    media_type: str, source: str, limit: int
) -> None:
    with pytest.raises(PayloadTooLarge, match=f"limit of {limit} characters"):
        parse(source.encode(), media_type, max_text_chars=limit)
    assert parse(source.encode(), media_type, max_text_chars=len(source)).text
