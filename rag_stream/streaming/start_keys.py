"""Starting a stream at most once per key: the ``Idempotency-Key`` a client sends with a start.

A client whose connection broke after it sent a start (the server died, a proxy cut it) has no
stream id to resume and cannot tell whether the stream began. Sent again with the same key, the
start finds the stream the first one began (the tenant's, while its log is kept) and reads it
from its first event, instead of starting a second stream. The same key with a different
request is refused: it cannot mean the same start. The key is kept as a digest, never as sent.

Two starts with one key that arrive together, before either has created its stream, may both
start one; the later is the one the key names from then on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from rag_stream.errors import StartKeyReused
from rag_stream.streaming.event_log import START_ALIAS, StreamMeta

HEADER = "Idempotency-Key"
MAX_CHARS = 255


@dataclass(frozen=True)
class StartKey:
    key: str  # a digest of the client's key
    fingerprint: str  # a digest of the request it came with (its route and body)

    @classmethod
    def of(cls, sent: str, route: str, body: bytes) -> StartKey:
        """From the header's value (checked by the caller) and the request it came with."""
        request = hashlib.sha256(route.encode() + b"\n" + body).hexdigest()
        return cls(hashlib.sha256(sent.encode()).hexdigest()[:32], request[:32])

    @property
    def alias(self) -> str:
        return START_ALIAS + self.key

    def check(self, meta: StreamMeta) -> None:
        """Refuse ``meta``, the stream this key started, unless the same request started it."""
        if meta.start_fingerprint != self.fingerprint:
            raise StartKeyReused(
                f"this {HEADER} started stream {meta.stream_id} with a different request: "
                "a key names one start (send a new key for a new request)",
                param=HEADER,
            )
