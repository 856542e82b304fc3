"""Event log, SSE encoding, resume, leases and cancellation."""
