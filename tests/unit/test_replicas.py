"""Routing requests to engine replicas: the same key always meets the same replica, keys spread
over the replicas, and a replica that is down or overloaded is passed over."""

from __future__ import annotations

from collections import Counter

from rag_stream.generation.replicas import Replica, Router


def _router(n: int = 3, max_waiting: int = 4) -> Router:
    return Router([Replica(f"http://engine-{i}:8000") for i in range(n)], max_waiting)


def test_a_key_always_goes_to_the_same_replica() -> None:
    router = _router()
    for key in ("conversation-a", "conversation-b", "f00d"):
        first = router.pick(key)
        assert all(router.pick(key) is first for _ in range(10))


def test_keys_spread_over_every_replica() -> None:
    router = _router()
    counts = Counter(router.pick(f"conversation-{i}").url for i in range(3000))  # type: ignore[union-attr]
    assert len(counts) == 3
    assert min(counts.values()) > 600  # each near a third (64 ring points a replica)


def test_removing_a_replica_moves_only_its_own_keys() -> None:
    three = _router(3)
    two = Router(three.replicas[:2], 4)
    keys = [f"k{i}" for i in range(2000)]
    moved = [k for k in keys if three.preferred(k).url != two.preferred(k).url]
    gone = three.replicas[2].url
    assert moved and all(three.preferred(k).url == gone for k in moved)


def test_a_down_replica_is_passed_over_for_the_least_loaded() -> None:
    router = _router()
    key = "conversation-a"
    home = router.preferred(key)
    home.healthy = False
    others = [r for r in router.replicas if r is not home]
    others[0].waiting, others[1].waiting = 3, 1
    assert router.pick(key) is others[1]
    home.healthy = True
    assert router.pick(key) is home


def test_an_overloaded_replica_sheds_to_the_least_loaded() -> None:
    router = _router(max_waiting=4)
    key = "conversation-a"
    home = router.preferred(key)
    home.waiting = 5
    chosen = router.pick(key)
    assert chosen is not home and chosen is not None and chosen.waiting == 0
    home.waiting = 4  # at the threshold: still home
    assert router.pick(key) is home


def test_no_usable_replica_gives_none() -> None:
    router = _router(2)
    first = router.pick("k")
    assert first is not None
    second = router.pick("k", exclude=[first])
    assert second is not None and second is not first
    assert router.pick("k", exclude=[first, second]) is None


def test_round_robin_takes_turns_and_skips_a_down_replica() -> None:
    router = Router([Replica(f"http://engine-{i}:8000") for i in range(3)], 4, round_robin=True)
    urls = [router.pick("conversation-a").url for _ in range(6)]  # type: ignore[union-attr]
    assert urls == [r.url for r in router.replicas] * 2  # the key is ignored
    router.replicas[1].healthy = False
    picked = [router.pick("conversation-a") for _ in range(4)]
    assert router.replicas[1] not in picked and len(set(map(id, picked))) == 2
    assert router.pick("k", exclude=[router.replicas[0], router.replicas[2]]) is None
