"""Turn uploaded bytes into text plus its block structure (paragraphs and headings).

Plain text splits on blank lines; Markdown is read with markdown-it-py (the stored text is the
Markdown source); HTML is read with BeautifulSoup and flattened to one block per block element;
PDF text comes from pypdf, one section per page. Every ``Block`` is a span of ``ParsedText.text``,
so chunk offsets computed from blocks point into the text that is stored and cited.

``parse`` is synchronous, CPU-bound and runs on untrusted bytes: uploads reach it through
``sandbox.parse_in_worker`` (a worker process with a time and memory budget). It refuses text
longer than ``max_text_chars`` (PDFs page by page, so pages sharing one content stream stop
early) and turns whatever a parser raises into an InvalidRequest that names the file's problem,
never the parser's internals.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import PurePath

from rag_stream.errors import InvalidRequest, PayloadTooLarge, RagStreamError, UnsupportedMediaType

PLAIN = "text/plain"
MARKDOWN = "text/markdown"
HTML = "text/html"
PDF = "application/pdf"
SUPPORTED = (PLAIN, MARKDOWN, HTML, PDF)

_BY_SUFFIX = {
    ".txt": PLAIN,
    ".text": PLAIN,
    ".md": MARKDOWN,
    ".markdown": MARKDOWN,
    ".html": HTML,
    ".htm": HTML,
    ".pdf": PDF,
}
_BY_CONTENT_TYPE = {
    PLAIN: PLAIN,
    MARKDOWN: MARKDOWN,
    "text/x-markdown": MARKDOWN,
    HTML: HTML,
    "application/xhtml+xml": HTML,
    PDF: PDF,
}
SUPPORTED_SUFFIXES = tuple(_BY_SUFFIX)
_DESCRIPTIONS = {
    PLAIN: "the text file",
    MARKDOWN: "the Markdown document",
    HTML: "the HTML document",
    PDF: "the PDF",
}


@dataclass(frozen=True)
class Block:
    """A paragraph-like span ``text[start:end]``; ``section`` is the nearest heading above it."""

    start: int
    end: int
    section: str | None = None
    is_heading: bool = False


@dataclass(frozen=True)
class ParsedText:
    text: str
    media_type: str
    blocks: list[Block] = field(default_factory=list)
    title: str | None = None


def media_type_for(filename: str | None, content_type: str | None) -> str:
    """The supported media type of an upload, by file suffix first, then by declared type."""
    suffix = PurePath(filename or "").suffix.lower()
    if suffix in _BY_SUFFIX:
        return _BY_SUFFIX[suffix]
    declared = (content_type or "").split(";", 1)[0].strip().lower()
    if not suffix and declared in _BY_CONTENT_TYPE:
        return _BY_CONTENT_TYPE[declared]
    what = f"{filename!r}" if filename else f"content type {declared or 'unknown'!r}"
    raise UnsupportedMediaType(
        f"unsupported file type: {what}; supported: {', '.join(SUPPORTED_SUFFIXES)}"
    )


def describe(media_type: str) -> str:
    """How messages name a file of this type ("the PDF")."""
    return _DESCRIPTIONS.get(media_type, "the file")


def parse(data: bytes, media_type: str, max_text_chars: int | None = None) -> ParsedText:
    """Text and blocks of an upload; PayloadTooLarge when its text is over ``max_text_chars``."""
    if media_type == PDF:
        return parse_pdf(data, max_text_chars)
    if media_type not in SUPPORTED:
        raise UnsupportedMediaType(f"unsupported media type {media_type!r}")
    text = decode_utf8(data)
    if media_type == HTML:
        parsed = parse_html(text)
        _check_length(HTML, len(parsed.text), max_text_chars)
        return parsed
    # Plain text and Markdown are stored as sent: no need to parse what is refused.
    _check_length(media_type, len(text), max_text_chars)
    if media_type == MARKDOWN:
        return parse_markdown(text)
    return parse_plain(text)


def _check_length(media_type: str, length: int, limit: int | None, where: str = "") -> None:
    if limit is not None and length > limit:
        raise PayloadTooLarge(
            f"{describe(media_type)} has more text than the limit of {limit} characters{where}"
        )


def parse_text(text: str, media_type: str, max_text_chars: int | None = None) -> ParsedText:
    """Text that arrived as a JSON string: plain or Markdown, held to the limit a file's text
    is (PayloadTooLarge past ``max_text_chars``)."""
    _check_length(media_type, len(text), max_text_chars)
    if media_type == MARKDOWN:
        return parse_markdown(text)
    if media_type == PLAIN:
        return parse_plain(text)
    raise UnsupportedMediaType(f"text documents are {PLAIN} or {MARKDOWN}, not {media_type!r}")


def decode_utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise InvalidRequest(
            f"file is not valid UTF-8 text: byte 0x{bad} at position {exc.start} ({exc.reason}); "
            "re-encode it as UTF-8"
        ) from None


def normalize(text: str) -> str:
    """One newline convention and no NUL characters (PostgreSQL text cannot hold them)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")


_PARAGRAPH = re.compile(r"\S(?:.*?\S)?(?=\n[ \t]*\n|\s*\Z)", re.DOTALL)


def paragraph_blocks(text: str, offset: int = 0, section: str | None = None) -> list[Block]:
    """Blank-line separated paragraphs of ``text``, trimmed, shifted by ``offset``."""
    return [Block(offset + m.start(), offset + m.end(), section) for m in _PARAGRAPH.finditer(text)]


def parse_plain(text: str) -> ParsedText:
    text = normalize(text)
    return ParsedText(text, PLAIN, paragraph_blocks(text))


def parse_markdown(text: str) -> ParsedText:
    from markdown_it import MarkdownIt

    text = normalize(text)
    line_starts = [0]
    for m in re.finditer("\n", text):
        line_starts.append(m.end())
    line_starts.append(len(text))

    def span(first: int, last: int) -> tuple[int, int]:
        start = line_starts[min(first, len(line_starts) - 1)]
        end = line_starts[min(last, len(line_starts) - 1)]
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        return start + lead, start + len(piece.rstrip())

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    blocks: list[Block] = []
    section: str | None = None
    title: str | None = None
    for i, tok in enumerate(tokens):
        if tok.level != 0 or tok.map is None or tok.nesting == -1:
            continue
        start, end = span(tok.map[0], tok.map[1])
        if start >= end:
            continue
        if tok.type == "heading_open":
            inline = tokens[i + 1] if i + 1 < len(tokens) else None
            heading = (inline.content if inline is not None else "").strip() or None
            section = heading
            if title is None and tok.tag == "h1":
                title = heading
            blocks.append(Block(start, end, section, is_heading=True))
        else:
            blocks.append(Block(start, end, section))
    return ParsedText(text, MARKDOWN, blocks, title)


_HTML_SKIP = {"script", "style", "noscript", "template", "head", "svg", "iframe", "object"}
_HTML_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
_HTML_BLOCKS = _HTML_HEADINGS | {
    "address", "article", "aside", "blockquote", "body", "caption", "dd", "details", "div",
    "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "header", "hr", "li",
    "main", "nav", "ol", "p", "pre", "section", "summary", "table", "td", "th", "tr", "ul",
}  # fmt: skip


def parse_html(html: str) -> ParsedText:
    from bs4 import BeautifulSoup
    from bs4.element import (
        Comment,
        Declaration,
        Doctype,
        NavigableString,
        ProcessingInstruction,
        Tag,
    )

    soup = BeautifulSoup(normalize(html), "html.parser")
    title_tag = soup.find("title")
    title = title_tag.get_text(" ", strip=True) if isinstance(title_tag, Tag) else None
    pieces: list[tuple[str, bool]] = []  # (block text, is heading)
    buffer: list[str] = []

    def flush(is_heading: bool = False) -> None:
        joined = "".join(buffer)
        buffer.clear()
        lines = [re.sub(r"[ \t\f\v]+", " ", line).strip() for line in joined.split("\n")]
        block = "\n".join(line for line in lines if line)
        if block:
            pieces.append((block, is_heading))

    def walk(node: Tag, in_pre: bool) -> None:
        for child in node.children:
            if isinstance(child, Comment | Declaration | Doctype | ProcessingInstruction):
                continue
            if isinstance(child, NavigableString):
                value = str(child)
                buffer.append(value if in_pre else re.sub(r"\s+", " ", value))
            elif isinstance(child, Tag):
                name = child.name.lower()
                if name in _HTML_SKIP:
                    continue
                if name == "br":
                    buffer.append("\n")
                elif name in _HTML_BLOCKS:
                    flush()
                    walk(child, in_pre or name == "pre")
                    flush(is_heading=name in _HTML_HEADINGS)
                else:
                    walk(child, in_pre)

    try:
        walk(soup, False)
    except RecursionError:
        raise InvalidRequest("HTML is nested too deeply to read") from None
    flush()
    parts: list[str] = []
    blocks: list[Block] = []
    section: str | None = None
    pos = 0
    for block_text, is_heading in pieces:
        if parts:
            parts.append("\n\n")
            pos += 2
        if is_heading:
            section = block_text.replace("\n", " ")[:512]
        parts.append(block_text)
        blocks.append(Block(pos, pos + len(block_text), section, is_heading))
        pos += len(block_text)
    if title is None:
        title = next((blocks_text for blocks_text, h in pieces if h), None)
    return ParsedText("".join(parts), HTML, blocks, title or None)


def parse_pdf(data: bytes, max_text_chars: int | None = None) -> ParsedText:
    try:
        pages, title = _pdf_pages(data, max_text_chars)
    except (RagStreamError, MemoryError):
        raise
    except Exception as exc:  # a hostile file reaches any corner of pypdf: each is a 422
        raise _unreadable_pdf(exc) from None
    if not any(pages):
        raise InvalidRequest(
            f"PDF has no extractable text ({len(pages)} page(s)); "
            "scanned documents need OCR before upload"
        )
    parts: list[str] = []
    blocks: list[Block] = []
    pos = 0
    for number, page in enumerate(pages, start=1):
        if not page:
            continue
        if parts:
            parts.append("\n\n")
            pos += 2
        parts.append(page)
        blocks.extend(paragraph_blocks(page, pos, f"page {number}"))
        pos += len(page)
    return ParsedText("".join(parts), PDF, blocks, title)


def _pdf_pages(data: bytes, max_text_chars: int | None) -> tuple[list[str], str | None]:
    """Each page's text, and the title from the metadata."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):
        raise InvalidRequest("PDF is encrypted; upload an unencrypted copy")
    pages: list[str] = []
    length = 0  # of the text parse_pdf joins, counted page by page so the limit stops early
    count = len(reader.pages)
    for number, page in enumerate(reader.pages, start=1):
        text = normalize(page.extract_text() or "").strip()
        if text:
            length += len(text) + (2 if length else 0)
            _check_length(PDF, length, max_text_chars, f" (reached on page {number} of {count})")
        pages.append(text)
    title = str(reader.metadata.title or "").strip() if reader.metadata else ""
    return pages, title[:512] or None  # outside the text limit; documents keep 512 anyway


_CRYPTO_MODULES = ("pypdf._encryption", "pypdf._crypt_providers")
_OBJECT_REPR = re.compile(r"IndirectObject\((\d+), (\d+), \d+\)")


def _unreadable_pdf(exc: Exception) -> InvalidRequest:
    """The file's problem, in words a person uploading it can act on."""
    from pypdf.errors import PyPdfError

    if isinstance(exc, RecursionError):
        return InvalidRequest("the PDF is nested too deeply to parse")
    if _raised_in(exc, _CRYPTO_MODULES):
        # pypdf implements only the Standard security handler, versions 1 to 5: anything else
        # (another handler, V=9) fails in its encryption code, and it is not a broken file.
        return InvalidRequest(
            "the PDF uses an encryption this server cannot read; upload an unencrypted copy"
        )
    problem = ""
    if isinstance(exc, PyPdfError):
        # pypdf's own errors describe the file ("EOF marker not found"); anything else it
        # raises (TypeError, KeyError ...) describes its internals. An object's repr carries the
        # reader's id(): name the object the way the PDF does instead.
        lines = _OBJECT_REPR.sub(r"object \1 \2 R", str(exc)).strip().splitlines()
        if lines and " at 0x" not in lines[0]:
            problem = f": {lines[0][:200]}"
    return InvalidRequest(f"the PDF could not be parsed{problem}")


def _raised_in(exc: BaseException, modules: tuple[str, ...]) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith(modules):
            return True
        tb = tb.tb_next
    return False
