"""How `make test` shares the suite between its two pytest-xdist workers (``-n 2``): two at
once, because one alone leaves a core idle about a third of the time (a vLLM start keeps one core
busy; a test waiting on a stream, a timer or a subprocess, none).

- The ``engines`` lane: the modules that share the session's vLLM servers and multi-process
  set-ups (tests/support/session_servers.py), run whole by one worker in collection order, so
  that each shared process starts ahead of its module and stops after its last user, as in a
  serial run.
- The ``service`` modules: everything else (unit tests, the in-process app
  (tests/support/inprocess.py), stub-engine servers, the CLIs, fuzzing). Each module is a unit
  of its own, handed to whichever worker is free: the other worker takes them one after another
  from the start, and the engines' worker joins in when its lane is done, so neither core idles
  at the end whichever part is longer on a given machine. Integration modules go out before the
  unit tests' short ones, which then fill the end.

``LaneScheduling`` does that hand-out, and a worker knows which tests it may still run
(``this_lane``). A shared vLLM process belongs to the engines lane: ``check_lanes`` fails the run
when an edit makes a service module use one (it would start twice). Without xdist (a module run
alone) everything runs in collection order.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

# modules whose tests start or share a vLLM engine, or start one ahead for a later module
# (START_AHEAD); any other is a service module
ENGINE_MODULES = frozenset(
    {
        "test_answers.py",
        "test_ask_cli.py",
        "test_chat_completions.py",
        "test_client.py",
        "test_client_jobs.py",
        "test_cluster.py",
        "test_coalesce.py",
        "test_default_stack.py",
        "test_detokenize_smollm2.py",
        "test_engine_death.py",
        "test_drafts.py",
        "test_generate_stream.py",
        "test_input_bounds.py",
        "test_job_redis_faults.py",
        "test_jobs.py",
        "test_jobs_restart.py",
        "test_kv_restore.py",
        "test_kv_server.py",
        "test_process_group.py",
        "test_resume.py",
        "test_takeover.py",
        "test_chat_page.py",
        "test_chat_stop_engine.py",
        "test_ai_sdk.py",
        "test_page_files.py",
    }
)


def lane_of_module(name: str) -> str:
    return "engines" if name in ENGINE_MODULES else "service"


def lane_of(item: pytest.Item) -> str:
    return lane_of_module(item.path.name)


def under_xdist(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


_BY_LANE = pytest.StashKey[dict[str, list[pytest.Item]]]()


def this_lane(item: pytest.Item) -> list[pytest.Item]:
    """The tests the process running ``item`` may run after it, in their order: under xdist,
    the engines lane and then every service module for the engines' worker (it takes service
    modules once its lane is done), the service modules for the other; all tests otherwise."""
    items = item.session.items
    if not under_xdist(item.config):
        return items
    by_lane = item.config.stash.get(_BY_LANE, None)
    if by_lane is None:
        service = [i for i in items if lane_of(i) == "service"]
        engines = [i for i in items if lane_of(i) == "engines"]
        by_lane = {"engines": engines + service, "service": service}
        item.config.stash[_BY_LANE] = by_lane
    return by_lane[lane_of(item)]


def hand_out_order(scopes: Iterable[str]) -> list[str]:
    """The order in which the scheduler's units go out: the engines lane first (the first free
    worker starts it), then the service modules as collected, unit tests last."""
    rank = {"engines": 0}
    return sorted(scopes, key=lambda scope: rank.get(scope, 2 if "/unit/" in scope else 1))


class LaneScheduling(LoadScopeScheduling):
    """xdist's scheduling by scope, the engines lane being one scope and each service module
    another (pytest 9's node ids no longer carry xdist's ``loadgroup`` marks). xdist gives a
    worker its next scope when it has two tests left of the last."""

    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return "engines" if lane_of_module(path.rsplit("/", 1)[-1]) == "engines" else path

    def _assign_work_unit(self, node: WorkerController) -> None:
        if not self._ordered:  # the queue is whole by the first assignment
            for scope in reversed(hand_out_order(self.workqueue)):
                self.workqueue.move_to_end(scope, last=False)
            self._ordered = True
        super()._assign_work_unit(node)


def check_lanes(items: Iterable[pytest.Item], shared: Iterable[str]) -> None:
    """Fail when a shared process (a session fixture of session_servers.py) is used by both
    lanes: under xdist each worker would start one of its own, two engines where the machine
    has room for one."""
    by_fixture: dict[str, set[str]] = {}
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            by_fixture.setdefault(fixture, set()).add(lane_of(item))
    both = sorted(f for f in shared if len(by_fixture.get(f, ())) > 1)
    if both:
        raise pytest.UsageError(
            f"used by both test lanes: {', '.join(both)}; move the modules that use them into "
            "the engines lane (tests/support/lanes.py)"
        )
