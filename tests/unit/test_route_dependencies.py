"""Every route and dependency of the app is a coroutine (or an object whose ``__call__`` is one):
FastAPI runs a plain function in its thread pool, a hand-off to a worker thread and back on
each request, which cost a 2-token stream about a tenth of its CPU (docs/benchmarks.md, "The
gateway's hot path", third round). The app is built, never started."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from rag_stream.app import create_app
from rag_stream.settings import Settings


def _runs_on_the_loop(call: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call):
        return True
    # a class instance (HTTPBearer): its __call__
    return not inspect.isfunction(call) and inspect.iscoroutinefunction(type(call).__call__)


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def test_no_route_or_dependency_runs_in_the_thread_pool() -> None:
    app = create_app(Settings(profile="test"))
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert len(routes) > 20  # the API's routes, not a stray few
    in_pool = sorted(
        {
            f"{route.path}: {getattr(call, '__qualname__', call)}"
            for route in routes
            for call in (route.endpoint, *_calls(route.dependant))
            if not _runs_on_the_loop(call)
        }
    )
    assert in_pool == []
