"""How the suite is shared between two workers (tests/support/lanes.py): the engines lane as one
unit, each service module as another, the order they go out in, and the check that keeps each
shared engine in the engines lane."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.support.lanes import (
    LaneScheduling,
    check_lanes,
    hand_out_order,
    lane_of_module,
    this_lane,
)


def test_the_engines_lane_is_one_unit_and_each_service_module_its_own() -> None:
    split = LaneScheduling._split_scope
    engines = "tests/integration/test_takeover.py::test_kill_9_mid_stream[x-1]"
    other_engines = "tests/e2e/test_chat_page.py::test_a_reload_offers_to_resume"
    service = "tests/unit/test_layers.py::test_no_import_cycle_between_parts_of_the_package"
    assert split(cast(Any, None), engines) == "engines" == split(cast(Any, None), other_engines)
    assert lane_of_module("test_takeover.py") == "engines"
    assert split(cast(Any, None), service) == "tests/unit/test_layers.py"
    assert lane_of_module("test_layers.py") == "service"


def test_the_engines_lane_goes_out_first_and_unit_tests_last() -> None:
    collected = [
        "tests/unit/test_a.py",
        "tests/unit/test_b.py",
        "tests/integration/test_c.py",
        "engines",
        "tests/integration/test_d.py",
    ]
    assert hand_out_order(collected) == [
        "engines",
        "tests/integration/test_c.py",
        "tests/integration/test_d.py",
        "tests/unit/test_a.py",
        "tests/unit/test_b.py",
    ]


def _item(module: str, *fixtures: str) -> pytest.Item:
    return cast(pytest.Item, SimpleNamespace(path=Path(module), fixturenames=list(fixtures)))


def test_a_shared_engine_asked_for_by_both_lanes_fails_the_run() -> None:
    ok = [_item("test_answers.py", "tiny_server"), _item("test_layers.py", "in_process")]
    check_lanes(ok, ["tiny_server"])
    both = [*ok, _item("test_admission.py", "tiny_server")]
    with pytest.raises(pytest.UsageError, match="tiny_server"):
        check_lanes(both, ["tiny_server"])


class _Worker:
    def __init__(self) -> None:
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)


def test_the_first_two_workers_get_the_engines_lane_and_the_first_integration_module() -> None:
    collection = [
        "tests/unit/test_a.py::test_one",
        "tests/integration/test_c.py::test_two",
        "tests/integration/test_takeover.py::test_three",
        "tests/integration/test_d.py::test_four",
    ]
    scheduler = LaneScheduling.__new__(LaneScheduling)
    scheduler.workqueue = OrderedDict(
        (scheduler._split_scope(nodeid), {nodeid: False}) for nodeid in collection
    )
    scheduler.assigned_work = {}
    first, second = _Worker(), _Worker()
    scheduler.registered_collections = {first: collection, second: collection}  # type: ignore[dict-item]
    scheduler._assign_work_unit(cast(Any, first))
    scheduler._assign_work_unit(cast(Any, second))
    scheduler._assign_work_unit(cast(Any, second))
    assert first.sent == [[2]]  # the engines lane
    assert second.sent == [[1], [3]]  # then the integration modules, the unit tests last
    assert list(scheduler.workqueue) == ["tests/unit/test_a.py"]


def test_the_engines_worker_keeps_what_a_later_service_module_shares() -> None:
    items = [
        _item("test_coalesce.py", "stub_server"),
        _item("test_redis_faults.py", "stub_server"),
        _item("test_takeover.py", "stub_server"),
    ]
    session = SimpleNamespace(items=items)
    config = SimpleNamespace(workerinput={}, stash=pytest.Stash())
    for item in items:
        cast(Any, item).session, cast(Any, item).config = session, config
    # the engines' worker may take test_redis_faults.py after its lane: stub_server stays up
    assert this_lane(items[2]) == [items[0], items[2], items[1]]
    assert this_lane(items[1]) == [items[1]]
