"""`namespace_topics_page`, the pure part of the client port's `GetTopicsOfNamespace`:
which metadata keys under a namespace's topics prefix are its topics, and how a listing
is cut into pages that fit a frame. Keys are built as the store holds them (sorted)."""

from __future__ import annotations

import random

import pytest

from danube_zmq.actors.schema.registry_admin import namespace_topics_page
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr


def _keys(namespace: str, topics: list[str], *, subscriptions: int = 0) -> list[str]:
    """The keys a namespace with these topics (and subscriptions on each) holds, sorted."""
    keys = []
    for topic in topics:
        full = f"/{namespace}/{topic}"
        keys.append(cr.topic_record_key(full))
        keys += [f"/topics{full}/subscriptions/s{i}" for i in range(subscriptions)]
        keys.append(f"{cr.producers_prefix(full)}7")
    return sorted(keys)


def _all_pages(keys: list[str], namespace: str, *, names_max: int, bytes_max: int) -> list[list[str]]:
    pages, start_after = [], None
    while True:
        page, more = namespace_topics_page(keys, namespace, start_after, names_max=names_max, bytes_max=bytes_max)
        pages.append(page)
        if not more:
            return pages
        assert page, "a page with more to come lists something"
        start_after = page[-1]


def test_only_topic_records_are_listed_sorted_by_full_name() -> None:
    """Cursors and producer records under a topic are not topics; a partitioned topic has
    one record (its base name), so it is listed once; names come sorted."""
    keys = _keys("ns", ["orders", "a-b", "a", "zz_9"], subscriptions=3)
    page, more = namespace_topics_page(keys, "ns", None, names_max=100, bytes_max=1 << 20)
    assert (page, more) == (["/ns/a", "/ns/a-b", "/ns/orders", "/ns/zz_9"], False)


def test_keys_of_another_namespace_are_not_listed() -> None:
    """A namespace whose name starts with this one's (`ns` and `ns2`) is another: its
    keys, were they handed in, are skipped."""
    keys = sorted(_keys("ns", ["a"]) + _keys("ns2", ["b"]))
    assert namespace_topics_page(keys, "ns", None, names_max=10, bytes_max=1 << 20) == (["/ns/a"], False)


def test_an_empty_namespace_lists_nothing() -> None:
    assert namespace_topics_page([], "ns", None, names_max=10, bytes_max=100) == ([], False)


def test_start_after_lists_the_names_after_it_only() -> None:
    """`start_after` need not be a topic: any name is a place in the order."""
    keys = _keys("ns", ["a", "b", "c"])
    assert namespace_topics_page(keys, "ns", "/ns/a", names_max=10, bytes_max=1 << 20) == (["/ns/b", "/ns/c"], False)
    assert namespace_topics_page(keys, "ns", "/ns/bb", names_max=10, bytes_max=1 << 20) == (["/ns/c"], False)
    assert namespace_topics_page(keys, "ns", "/ns/c", names_max=10, bytes_max=1 << 20) == ([], False)


def test_a_page_ends_at_names_max_and_says_more_follow() -> None:
    """Exactly `names_max` topics: one page, nothing more; one over: `more`."""
    keys = _keys("ns", ["a", "b", "c"])
    assert namespace_topics_page(keys, "ns", None, names_max=3, bytes_max=1 << 20) == (["/ns/a", "/ns/b", "/ns/c"],
                                                                                       False)
    assert namespace_topics_page(keys, "ns", None, names_max=2, bytes_max=1 << 20) == (["/ns/a", "/ns/b"], True)


def test_a_page_ends_before_its_names_pass_bytes_max_but_always_lists_one() -> None:
    """Names of 9 characters cost 12 bytes each (msgpack's header counted): 24 bytes hold
    two; a bound smaller than one name still lists that name, so a listing moves on."""
    keys = _keys("ns", ["name1", "name2", "name3"])
    assert namespace_topics_page(keys, "ns", None, names_max=10, bytes_max=24) == (["/ns/name1", "/ns/name2"], True)
    assert namespace_topics_page(keys, "ns", None, names_max=10, bytes_max=1) == (["/ns/name1"], True)


def test_the_page_bound_holds_ten_thousand_of_the_longest_names_in_the_default_frame() -> None:
    """TOPICS_OF_NAMESPACE_PAGE_MAX names of 512 characters (255-character parts) fit
    half the default frame (16 MiB), so with the defaults only the count cuts pages."""
    longest = 1 + 255 + 1 + 255
    assert cp.TOPICS_OF_NAMESPACE_PAGE_MAX * (longest + 3) <= (16 << 20) // 2


@pytest.mark.parametrize("seed", range(20))
def test_pages_put_together_are_the_whole_listing_once(seed: int) -> None:
    """Random namespaces and bounds: following `start_after` page by page lists every
    topic exactly once, in order, each page within its bounds."""
    rng = random.Random(seed)
    alphabet = "ab-_09Z"
    topics = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(rng.randint(0, 60))})
    keys = _keys("ns", topics, subscriptions=rng.randint(0, 2))
    names_max, bytes_max = rng.randint(1, 8), rng.randint(1, 120)
    pages = _all_pages(keys, "ns", names_max=names_max, bytes_max=bytes_max)
    assert [name for page in pages for name in page] == [f"/ns/{t}" for t in topics]
    for page in pages:
        assert len(page) <= names_max
        assert len(page) <= 1 or sum(len(name) + 3 for name in page) <= bytes_max
