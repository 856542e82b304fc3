"""The one exception tree of rag-stream.

RagStreamError                      500 internal_error
├── ConfigError                     (start-up only; printed as one line, never served)
├── IncompatiblePlan                500 incompatible_plan (a stream saved by another version)
├── InvalidRequest                  422 invalid_request
│   ├── BadRequest                  400 invalid_request (OpenAI's routes: its status for it)
│   └── StartKeyReused              422 idempotency_key_reused (one key, another request)
├── Unauthorized                    401 invalid_api_key (with WWW-Authenticate: Bearer)
├── NotFound                        404 not_found
│   └── ModelNotFound               404 model_not_found
├── Conflict                        409 conflict
├── PayloadTooLarge                 413 payload_too_large
├── UnsupportedMediaType            415 unsupported_media_type
├── TooManyRequests                 429 too_many_requests (with Retry-After)
└── ServiceUnavailable              503 service_unavailable
    ├── DatabaseUnavailable         503 database_unavailable
    ├── EngineUnavailable           503 engine_unavailable
    │   └── EngineDied              (the in-process engine's core died: its streams go on elsewhere)
    ├── EventLogUnavailable         503 event_log_unavailable
    ├── StartInterrupted            503 start_interrupted (its process died during retrieval)
    └── VectorStoreUnavailable      503 vector_store_unavailable

Every error renders as ``{"error": {"code", "message", "type", "param"}}`` with its status code
(``type`` and ``param`` as in OpenAI's error object, so OpenAI clients read every error too), and
inside an SSE stream as an ``error`` event with the same code and message.
"""

from __future__ import annotations


class RagStreamError(Exception):
    status_code = 500
    code = "internal_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request field at fault, if one is (OpenAI's ``param``)


class ConfigError(RagStreamError):
    code = "config_error"


class IncompatiblePlan(RagStreamError):
    code = "incompatible_plan"


class InvalidRequest(RagStreamError):
    status_code = 422
    code = "invalid_request"


class BadRequest(InvalidRequest):
    status_code = 400


class StartKeyReused(InvalidRequest):
    code = "idempotency_key_reused"


class Unauthorized(RagStreamError):
    status_code = 401
    code = "invalid_api_key"


class NotFound(RagStreamError):
    status_code = 404
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class Conflict(RagStreamError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(RagStreamError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(RagStreamError):
    status_code = 415
    code = "unsupported_media_type"


class TooManyRequests(RagStreamError):
    status_code = 429
    code = "too_many_requests"

    def __init__(self, message: str, param: str | None = None, retry_after_s: int = 1) -> None:
        super().__init__(message, param)
        self.retry_after_s = retry_after_s  # sent as Retry-After


class ServiceUnavailable(RagStreamError):
    status_code = 503
    code = "service_unavailable"


class DatabaseUnavailable(ServiceUnavailable):
    code = "database_unavailable"


class EngineUnavailable(ServiceUnavailable):
    code = "engine_unavailable"


class EngineDied(EngineUnavailable):
    """The in-process engine's core died, and it never comes back. A stream that meets this is
    not ended: it is left, as at shutdown, to a process that can continue it, and this process
    stops itself (``create_app``)."""


class EventLogUnavailable(ServiceUnavailable):
    code = "event_log_unavailable"


class StartInterrupted(ServiceUnavailable):
    """A stream whose process died before it saved what a takeover needs (during retrieval):
    it cannot be continued, and asking again is the remedy."""

    code = "start_interrupted"


class VectorStoreUnavailable(ServiceUnavailable):
    code = "vector_store_unavailable"


def _all_subclasses(cls: type[RagStreamError]) -> list[type[RagStreamError]]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


def from_code(code: str, message: str) -> RagStreamError:
    """Rebuild the exception an ``error`` event was made from (for non-streaming responses)."""
    for cls in _all_subclasses(RagStreamError):
        if cls.code == code:
            return cls(message)
    return RagStreamError(message)
