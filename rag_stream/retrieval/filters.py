"""Metadata filters as plain conditions, which each vector store backend turns into its own.

The semantics are the ``VectorStore.search`` contract: every key must match; a value matches
equal values of the same JSON type (numbers by value, so 2 is 2.0; true is not 1), a list any
of its values, and a document whose value is a list matches if any element does. Qdrant (server,
local mode, edge) matches a point whose payload value is a list if any element matches, keeps
booleans, integers and strings apart in an exact match, and never matches a boolean by range;
so three kinds of condition carry it:

- ``AnyKeyword``: the value is one of these strings (what a keyword index serves);
- ``Exact``: equal to this boolean, or to this integer too large to be exact as a float;
- ``NumberEquals``: the range [v, v], which matches an integer and the equal float alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rag_stream.schemas.kbs import MetaValue

META_PREFIX = "meta."  # document metadata sits under this payload key

# Integers below 2**53 in size are exact as floats: a range [v, v] matches them (and equal
# floats) and nothing else. A larger one is matched as an integer, exactly.
_EXACT_FLOAT_INT = 2**53


@dataclass(frozen=True)
class AnyKeyword:
    key: str
    values: list[str]


@dataclass(frozen=True)
class Exact:
    key: str
    value: bool | int


@dataclass(frozen=True)
class NumberEquals:
    key: str
    value: float


Condition = AnyKeyword | Exact | NumberEquals
# Every inner list must match at least one of its conditions (AND of ORs).
Conditions = list[list[Condition]]


def meta_conditions(meta_filter: Mapping[str, MetaValue] | None) -> Conditions | None:
    """The conditions for a metadata filter; None when nothing can match (an empty list)."""
    groups: Conditions = []
    for key, value in (meta_filter or {}).items():
        group = _one_key(META_PREFIX + key, value)
        if not group:
            return None
        groups.append(group)
    return groups


def _one_key(key: str, value: MetaValue) -> list[Condition]:
    values = value if isinstance(value, list) else [value]
    strings = [v for v in values if isinstance(v, str)]
    group: list[Condition] = [AnyKeyword(key, strings)] if strings else []
    for v in values:
        if isinstance(v, str):
            continue
        if isinstance(v, bool) or (isinstance(v, int) and abs(v) >= _EXACT_FLOAT_INT):
            group.append(Exact(key, v))
        elif isinstance(v, int | float):  # an exact int match would miss 2.0
            group.append(NumberEquals(key, float(v)))
        else:  # a caller that skipped the schema; an open range would match every number
            raise TypeError(f"cannot filter {key} on a {type(v).__name__}")
    return group
