"""The package's parts import one another in one direction only, and each kind of stream is a
slice of its own.

Reads every module's imports with ``ast`` (function-local imports included, so a cycle cannot
hide inside a function) and checks that each top-level part of ``rag_stream`` (``api``,
``streaming``, ``store``, ``app``, ...) imports only parts of lower layers (``LAYERS``). A kind's
routes (``rag_stream/kinds/<kind>/routes.py``) and the list of kinds (``kinds/registry.py``)
are a part of their own, ``kinds.routes``, above ``api`` (they use its dependencies); the rest
of ``rag_stream/kinds`` is below it. Run alone: ``pytest tests/unit/test_layers.py``.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rag_stream"

# Bottom to top: a part may import only parts of a lower layer. A new part must be placed here.
LAYERS: dict[str, int] = {
    "errors": 0,
    "malloc_arenas": 0,
    "children": 0,  # child processes that die with this one: the standard library only
    "settings": 1,
    "schemas": 1,
    "metrics": 2,
    "store": 2,
    "generation": 2,
    "client": 2,  # lifted into other programs: schemas and errors only (below)
    "retrieval": 3,
    "kv": 3,
    "ask_cli": 3,
    "job_cli": 3,
    "ingest": 4,
    "streaming": 5,  # streams of any kind: it knows none of them (below)
    "kinds": 6,  # the kinds' plans, producers and intents, and what they share
    "resources": 7,
    "api": 8,  # dependencies, shared route helpers, routes of no kind, the chat chunk format
    "kinds.routes": 9,  # each kind's routes, and the registry that lists the kinds
    "openai": 10,  # OpenAI's chat completions and models: a wire over two kinds
    "ai_sdk": 11,  # the AI SDK's UI chat: another wire, on OpenAI's model ids
    "preflight": 12,
    "prepare": 12,
    "app": 12,
    "cli": 13,
    "__main__": 14,
}
# What a kind's folder may import of rag_stream.kinds besides itself: what all kinds share.
SHARED_KIND_MODULES = {"base", "plan", "tokens"}


def _part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "rag_stream" or len(parts) < 2:
        return None
    if parts[1] == "kinds" and len(parts) > 2 and parts[-1] in ("routes", "registry"):
        return "kinds.routes"
    return parts[1]


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = path.relative_to(PACKAGE.parent).with_suffix("")
        here = _part(".".join(source.parts))
        if here is None or here == "__init__":
            continue
        graph[here]
        for name in _imports(path):
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
    assert {"api", "streaming", "kinds", "kinds.routes", "store", "schemas"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_two_packages_import_each_other() -> None:
    """At the level of top-level packages too (a kind's routes count as ``kinds``): routes
    that need the kinds live in a kind's folder or above them, never in ``api``."""
    graph: dict[str, set[str]] = defaultdict(set)
    for part, targets in import_graph().items():
        graph[part.split(".")[0]] |= {t.split(".")[0] for t in targets} - {part.split(".")[0]}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_every_part_imports_only_lower_layers() -> None:
    graph = import_graph()
    unplaced = set(graph) - set(LAYERS)
    assert not unplaced, f"place {sorted(unplaced)} in LAYERS (tests/unit/test_layers.py)"
    for part, targets in graph.items():
        upward = sorted(t for t in targets if LAYERS[t] >= LAYERS[part])
        assert not upward, f"{part} (layer {LAYERS[part]}) imports {upward}, not below it"


def test_streaming_knows_no_stream_kind() -> None:
    graph = import_graph()
    assert not graph["streaming"] & {"kinds", "kinds.routes", "api"}
    for path in (PACKAGE / "streaming").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for name in ('"answer"', '"generate"', '"job"'):
            assert name not in text, f"{path.name} names the kind {name}"


def test_a_kind_imports_no_other_kind() -> None:
    """A kind is a vertical slice: its folder uses what all kinds share, never another kind."""
    kinds = PACKAGE / "kinds"
    for folder in (p for p in kinds.iterdir() if p.is_dir() and p.name != "__pycache__"):
        for path in folder.glob("*.py"):
            for name in _imports(path):
                parts = name.split(".")
                if parts[:2] != ["rag_stream", "kinds"] or len(parts) < 3:
                    continue
                inside = parts[2] == folder.name or parts[2] in SHARED_KIND_MODULES
                assert inside, f"kinds/{folder.name}/{path.name} imports {name}"


def test_streams_start_only_through_the_front_door() -> None:
    """Admission, the priority rule and the start are ``Streams.launch``'s: no route or kind
    takes a ticket or starts a producer itself."""
    pattern = re.compile(r"\.ticket\(|\bproducers\.start\(|\bAdmission\(")
    for path in [*(PACKAGE / "api").rglob("*.py"), *(PACKAGE / "kinds").rglob("*.py")]:
        found = pattern.search(path.read_text(encoding="utf-8"))
        assert found is None, f"{path.relative_to(PACKAGE)} calls {found.group(0)} itself"


def test_the_client_imports_nothing_of_the_server() -> None:
    # rag_stream.client is meant to be lifted into other programs: schemas and errors only
    assert import_graph()["client"] <= {"schemas", "errors"}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
