"""How many malloc arenas glibc may give the service's threads.

glibc gives a thread that finds the shared heap busy an arena of its own, up to 8 per core, and
each arena keeps its own free memory. The threads of the embedder (torch's and ONNX Runtime's),
the parse workers' pipes and the thread pools of a long-running server then leave memory held in
many arenas, which ``malloc_trim`` cannot return. In the soak (docs/reliability.md) the
knowledge-base server so held ~4.7 MB more a minute over 15 minutes; with two arenas, none.

The cap is set through ``mallopt`` before the service starts its threads; glibc's own
``MALLOC_ARENA_MAX`` environment variable, when set, is left to rule.
"""

from __future__ import annotations

import ctypes
import logging
import os

M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)
ARENAS = 2

log = logging.getLogger(__name__)


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap the arenas glibc creates from now on; whether the cap was set (not on another C
    library, nor when ``MALLOC_ARENA_MAX`` is set)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    if mallopt(M_ARENA_MAX, arenas) != 1:
        log.warning("malloc: glibc refused a cap of %d arenas", arenas)
        return False
    return True
