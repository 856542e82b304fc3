"""The package's subpackages import one another in one direction only.

Reads every module's imports with ``ast`` (function-local imports included, so a cycle cannot
hide inside a function) and checks that the graph between top-level parts of ``rag_stream``
(``api``, ``streaming``, ``store``, ``app``, ...) has no cycle, and that the lowest layers import
nothing from the layers above them. Run alone: ``pytest tests/unit/test_layers.py``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rag_stream"

# A part may import only parts listed for it (or nothing); higher parts are not listed below.
FOUNDATION = {
    "errors": set(),
    "settings": {"errors"},
    "schemas": {"errors"},
    "store": {"errors", "settings", "schemas"},
    "metrics": {"schemas"},
}


def _part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "rag_stream" or len(parts) < 2:
        return None
    return parts[1]


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = path.relative_to(PACKAGE.parent).with_suffix("")
        here = _part(".".join(source.parts))
        if here is None or here == "__init__":
            continue
        graph[here]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                there = _part(name)
                if there is not None and there != here:
                    graph[here].add(there)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycle_between_parts_of_the_package() -> None:
    graph = import_graph()
    assert {"api", "streaming", "pipeline", "store", "schemas"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_lower_layers_import_nothing_from_higher_ones() -> None:
    graph = import_graph()
    for part, allowed in FOUNDATION.items():
        extra = graph.get(part, set()) - allowed
        assert not extra, f"{part} imports {sorted(extra)}; it may import only {sorted(allowed)}"


def test_streaming_knows_no_stream_kind() -> None:
    graph = import_graph()
    assert "pipeline" not in graph["streaming"]
    assert "api" not in graph["streaming"]
    for path in (PACKAGE / "streaming").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for name in ('"answer"', '"generate"'):
            assert name not in text, f"{path.name} names the kind {name}"


def test_the_client_imports_nothing_of_the_server() -> None:
    # rag_stream.client is meant to be lifted into other programs: schemas and errors only
    assert import_graph()["client"] <= {"schemas", "errors"}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
