"""Turn uploaded bytes into text plus its block structure (paragraphs and headings).

Plain text splits on blank lines; Markdown is read with markdown-it-py (the stored text is the
Markdown source); HTML is read with BeautifulSoup and flattened to one block per block element;
PDF text comes from pypdf, one section per page. Every ``Block`` is a span of ``ParsedText.text``,
so chunk offsets computed from blocks point into the text that is stored and cited.

``parse`` is synchronous and CPU-bound: call it through ``anyio.to_thread``.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import PurePath

from rag_stream.errors import InvalidRequest, UnsupportedMediaType

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


def parse(data: bytes, media_type: str) -> ParsedText:
    if media_type == PDF:
        return parse_pdf(data)
    text = decode_utf8(data)
    if media_type == MARKDOWN:
        return parse_markdown(text)
    if media_type == HTML:
        return parse_html(text)
    if media_type == PLAIN:
        return parse_plain(text)
    raise UnsupportedMediaType(f"unsupported media type {media_type!r}")


def parse_text(text: str, media_type: str) -> ParsedText:
    """Text that arrived as a JSON string: plain or Markdown."""
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


def parse_pdf(data: bytes) -> ParsedText:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise InvalidRequest("PDF is encrypted; upload an unencrypted copy")
        pages = [normalize(page.extract_text() or "").strip() for page in reader.pages]
        meta_title = reader.metadata.title if reader.metadata else None
    except InvalidRequest:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise InvalidRequest(f"not a readable PDF: {exc}") from None
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
    title = str(meta_title).strip() if meta_title else None
    return ParsedText("".join(parts), PDF, blocks, title or None)
