"""PDF fixtures. fpdf2 writes text and pypdf a blank page; hostile files are written byte by
byte (``raw_pdf``), since no well-behaved writer produces them."""

from __future__ import annotations

import io
import zlib


def make_pdf(*pages: str) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    for page in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, page)
    return bytes(pdf.output())


def blank_pdf() -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def raw_pdf(objects: list[bytes], trailer: bytes = b"") -> bytes:
    """A PDF whose object n is ``objects[n - 1]`` (object 1 is the catalog), with a correct
    cross-reference table; ``trailer`` is added to the trailer dictionary."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R %s >>\n" % (len(objects) + 1, trailer)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def stream(data: bytes, *, deflate: bool = False) -> bytes:
    if deflate:
        data = zlib.compress(data, 9)
        return b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(data), data)
    return b"<< /Length %d >>\nstream\n%s\nendstream" % (len(data), data)


def shared_content_pdf(
    content: bytes,
    pages: int = 1,
    *,
    deflate: bool = False,
    extra: tuple[bytes, ...] = (),
    trailer: bytes = b"",
) -> bytes:
    """``pages`` pages that all draw one content stream (object 4), in Helvetica as /F1.
    ``extra`` objects are numbered from 5 on."""
    page = len(extra) + 5
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        # Every kid is the same page object: the file stays small however many pages it has.
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join([b"%d 0 R" % page] * pages), pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        stream(content, deflate=deflate),
        *extra,
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>",
    ]
    return raw_pdf(objects, trailer)


def show_text(text: str) -> bytes:
    """A content stream showing ``text`` (ASCII, no parentheses) at the top of the page."""
    return b"BT /F1 12 Tf 72 720 Td (%s) Tj ET" % text.encode("ascii")


def encrypted_pdf(handler: bytes = b"Standard", version: int = 2) -> bytes:
    """A PDF whose /Encrypt dictionary names security ``handler``, algorithm ``version``."""
    encrypt = b"<< /Filter /%s /V %d /R 3 /Length 128 /O <%s> /U <%s> /P -4 >>" % (
        handler,
        version,
        b"00" * 32,
        b"00" * 32,
    )
    file_id = b"<%s>" % (b"11" * 16)
    trailer = b"/Encrypt 5 0 R /ID [%s %s]" % (file_id, file_id)
    return shared_content_pdf(show_text("secret"), extra=(encrypt,), trailer=trailer)


def nested_arrays_pdf(depth: int = 200_000) -> bytes:
    """A text operator whose operand is ``depth`` arrays deep."""
    content = b"BT /F1 12 Tf %s(x)%s TJ ET" % (b"[" * depth, b"]" * depth)
    return shared_content_pdf(content)


def text_bomb_pdf(operators: int = 700_000) -> bytes:
    """A ~8 KB file whose one content stream inflates to 7 bytes per operator, each showing one
    character: parsing it takes pypdf tens of seconds and hundreds of MB."""
    return shared_content_pdf(b"BT /F1 12 Tf " + b"(x) Tj " * operators + b"ET", deflate=True)


def zeros_bomb_pdf(size: int = 5_000_000) -> bytes:
    """A ~5 KB file whose content stream inflates to ``size`` zero bytes."""
    return shared_content_pdf(b"\0" * size, deflate=True)


def slow_blank_pdf(pages: int = 100, operators: int = 100_000) -> bytes:
    """A ~2 KB file whose pages share a content stream of ``operators`` operators that show
    nothing: every page costs pypdf over a second, in little memory, for no text at all."""
    return shared_content_pdf(b"BT /F1 12 Tf " + b"() Tj " * operators + b"ET", pages, deflate=True)


def linking_pdf(url: str) -> bytes:
    """A page of text that points at ``url`` every way the format allows: an open action, a URI
    base, a link annotation, and a remote go-to naming a URL file specification."""
    u = url.encode()
    return raw_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R /URI << /Base (%s) >> "
            b"/OpenAction << /S /URI /URI (%s/open) >> >>" % (u, u),
            b"<< /Type /Pages /Kids [6 0 R] /Count 1 >>",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            stream(show_text("Herons nest by the river")),
            b"<< /Type /Annot /Subtype /Link /Rect [0 0 100 100] "
            b"/A << /S /GoToR /F << /FS /URL /F (%s/remote.pdf) >> /D [0 /Fit] >> >>" % u,
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R /Annots [5 0 R 7 0 R] >>",
            b"<< /Type /Annot /Subtype /Link /Rect [0 0 50 50] /A << /S /URI /URI (%s/a) >> >>" % u,
        ]
    )
