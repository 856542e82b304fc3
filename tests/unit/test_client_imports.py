"""The client can be lifted into another program: importing it loads none of the server."""

from __future__ import annotations

import subprocess
import sys

SERVER_LIBRARIES = ("fastapi", "starlette", "sqlalchemy", "redis", "vllm", "torch", "qdrant_client")


def test_importing_the_client_loads_no_server_library() -> None:
    code = (
        "import sys, rag_stream.client, rag_stream.ask_cli\n"
        f"print(','.join(m for m in {SERVER_LIBRARIES!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
