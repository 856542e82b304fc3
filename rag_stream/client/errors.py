"""The server's errors as the client raises them: rag-stream's own exception tree.

An error answer ``{"error": {"code", "message", ...}}`` becomes the class of its code
(``rag_stream.errors.from_code``: ``NotFound``, ``InvalidRequest``, ``TooManyRequests``, ...)
carrying the response's ``status_code``, the server's ``code`` (also one this version does not
know, on the root class), ``message`` and ``param``. A body that is not rag-stream's (a proxy's
502 page, say) gets the code ``http_<status>``.

``StreamInterrupted`` is the client's own: a stream it could not resume within its retries.
"""

from __future__ import annotations

import httpx

from rag_stream.errors import RagStreamError, TooManyRequests, from_code


class StreamInterrupted(RagStreamError):
    """The connection to a stream was lost and resuming failed ``max_retries`` times in a row
    (or the stream was lost before its id was known). The stream may still be running on the
    server: ``follow(stream_id, after=last_event_id)`` continues it later."""

    status_code = 503
    code = "stream_interrupted"

    def __init__(self, message: str, stream_id: str | None = None, last_event_id: int = -1) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.last_event_id = last_event_id


def _fields(response: httpx.Response) -> tuple[str, str, str | None]:
    try:
        body = response.json()
        error = body["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        text = response.text.strip()[:200] or response.reason_phrase
        return f"http_{response.status_code}", text, None
    param = error.get("param")
    return code, message, param if isinstance(param, str) else None


def api_error(response: httpx.Response) -> RagStreamError:
    """The exception an error response stands for (its body must have been read)."""
    code, message, param = _fields(response)
    exc = from_code(code, message)
    exc.code = code
    exc.status_code = response.status_code
    exc.param = param
    retry_after = response.headers.get("retry-after", "")
    if isinstance(exc, TooManyRequests) and retry_after.isdigit():
        exc.retry_after_s = int(retry_after)
    return exc
