"""A server process in which SIGUSR2 makes glibc give freed heap memory back to the system.

    python -m tests.support.trimmable stub     # tests/support/stub_server.py
    python -m tests.support.trimmable serve    # rag-stream serve

RSS counts heap pages that Python and the libraries have freed but that glibc keeps for later
(``malloc_trim`` returns them). The soak (scripts/soak.py) sends the signal at its baseline and
at its end, so that memory the process still holds can be told from memory it once used: a
leak grows both, freed memory only the first.
"""

from __future__ import annotations

import ctypes
import signal
import sys


def main() -> None:
    libc = ctypes.CDLL("libc.so.6")
    signal.signal(signal.SIGUSR2, lambda *_: libc.malloc_trim(0))
    which = sys.argv[1]
    if which == "stub":
        from tests.support.stub_server import main as stub

        sys.argv = sys.argv[:1]
        stub()
    elif which == "serve":
        from rag_stream.cli import main as cli

        sys.exit(cli(["serve"]))
    else:
        raise SystemExit(f"usage: python -m tests.support.trimmable stub|serve, not {which!r}")


if __name__ == "__main__":
    main()
