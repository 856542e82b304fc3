"""The suite's two lanes (tests/support/lanes.py): which worker runs a test, and the check that
keeps each shared engine in one lane."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.support.lanes import LaneScheduling, check_lanes, lane_of_module


def test_a_node_id_is_scheduled_by_its_module_s_lane() -> None:
    split = LaneScheduling._split_scope
    engines = "tests/integration/test_takeover.py::test_kill_9_mid_stream[x-1]"
    service = "tests/unit/test_layers.py::test_no_import_cycle_between_parts_of_the_package"
    assert split(cast(Any, None), engines) == "engines" == lane_of_module("test_takeover.py")
    assert split(cast(Any, None), service) == "service" == lane_of_module("test_layers.py")


def _item(module: str, *fixtures: str) -> pytest.Item:
    return cast(pytest.Item, SimpleNamespace(path=Path(module), fixturenames=list(fixtures)))


def test_a_shared_engine_asked_for_by_both_lanes_fails_the_run() -> None:
    ok = [_item("test_answers.py", "tiny_server"), _item("test_layers.py", "in_process")]
    check_lanes(ok, ["tiny_server"])
    both = [*ok, _item("test_admission.py", "tiny_server")]
    with pytest.raises(pytest.UsageError, match="tiny_server"):
        check_lanes(both, ["tiny_server"])
