"""Couchbase's official Python SDK (4.x, on the C++ core the other SDKs share) against a
real node process: the KV and sub-document API an application uses, end to end.

The SDK is a test dependency (`pip install -e '.[test]'`); the module is skipped only
where the package cannot be installed."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest

couchbase = pytest.importorskip("couchbase", reason="the couchbase SDK is not installed")

from couchbase.auth import PasswordAuthenticator  # noqa: E402
from couchbase.cluster import Cluster  # noqa: E402
from couchbase.exceptions import (  # noqa: E402
    CasMismatchException,
    DeltaInvalidException,
    DocumentExistsException,
    DocumentLockedException,
    DocumentNotFoundException,
    PathNotFoundException,
)
from couchbase.options import (  # noqa: E402
    ClusterOptions,
    ClusterTimeoutOptions,
    GetOptions,
    IncrementOptions,
    DecrementOptions,
    ReplaceOptions,
    DeltaValue,
    SignedInt64,
)
import couchbase.subdocument as SD  # noqa: E402


@pytest.fixture(scope="module")
def coll(shared_node):
    opts = ClusterOptions(
        PasswordAuthenticator(shared_node.username, shared_node.password),
        timeout_options=ClusterTimeoutOptions(kv_timeout=timedelta(seconds=3),
                                              connect_timeout=timedelta(seconds=30)))
    cluster = Cluster(f"couchbase://{shared_node.host}:{shared_node.port}", opts)
    yield cluster.bucket(shared_node.bucket).default_collection()
    cluster.close()


def test_crud_with_cas(coll):
    r = coll.upsert("sdk::crud", {"n": 1})
    assert coll.get("sdk::crud").content_as[dict] == {"n": 1}
    with pytest.raises(DocumentExistsException):
        coll.insert("sdk::crud", {"n": 2})
    with pytest.raises(CasMismatchException):
        coll.replace("sdk::crud", {"n": 3}, ReplaceOptions(cas=r.cas + 1))
    coll.replace("sdk::crud", {"n": 3}, ReplaceOptions(cas=r.cas))
    coll.remove("sdk::crud")
    assert not coll.exists("sdk::crud").exists


def test_counters(coll):
    b = coll.binary()
    assert b.increment("sdk::ctr", IncrementOptions(initial=SignedInt64(10))).content == 10
    assert b.increment("sdk::ctr", IncrementOptions(delta=DeltaValue(5))).content == 15
    assert b.decrement("sdk::ctr", DecrementOptions(delta=DeltaValue(20))).content == 0
    coll.upsert("sdk::notnum", "abc")
    with pytest.raises(DeltaInvalidException):  # DELTA_BADVAL
        b.increment("sdk::notnum")


def test_touch_get_and_touch_and_expiry(coll):
    coll.upsert("sdk::ttl", {"a": 1})
    coll.touch("sdk::ttl", timedelta(seconds=100))
    got = coll.get("sdk::ttl", GetOptions(with_expiry=True))
    left = got.expiry_time.timestamp() - time.time()
    assert 90 < left <= 101
    assert coll.get_and_touch("sdk::ttl", timedelta(seconds=1)).content_as[dict] == {"a": 1}
    time.sleep(2.2)
    with pytest.raises(DocumentNotFoundException):
        coll.get("sdk::ttl")


def test_get_and_lock_and_unlock(coll):
    coll.upsert("sdk::lock", {"v": 1})
    locked = coll.get_and_lock("sdk::lock", timedelta(seconds=10))
    with pytest.raises(DocumentLockedException):
        coll.get_and_lock("sdk::lock", timedelta(seconds=10))
    coll.unlock("sdk::lock", locked.cas)
    coll.upsert("sdk::lock", {"v": 2})
    locked = coll.get_and_lock("sdk::lock", timedelta(seconds=10))
    coll.replace("sdk::lock", {"v": 3}, ReplaceOptions(cas=locked.cas))  # the lock's CAS
    assert coll.get("sdk::lock").content_as[dict] == {"v": 3}


def test_lookup_in_and_mutate_in(coll):
    coll.upsert("sdk::sub", {"name": "x", "tags": ["a"], "n": 1})
    r = coll.mutate_in("sdk::sub", [SD.upsert("addr.city", "Paris", create_parents=True),
                                    SD.array_append("tags", "b"),
                                    SD.increment("n", 4),
                                    SD.upsert("meta.by", "app", xattr=True,
                                              create_parents=True)])
    assert r.content_as[int](2) == 5
    res = coll.lookup_in("sdk::sub", [SD.get("addr.city"), SD.exists("tags"),
                                      SD.count("tags"), SD.get("meta", xattr=True)])
    assert res.content_as[str](0) == "Paris"
    assert res.exists(1)
    assert res.content_as[int](2) == 2
    assert res.content_as[dict](3) == {"by": "app"}
    with pytest.raises(PathNotFoundException):
        coll.lookup_in("sdk::sub", [SD.get("nope")]).content_as[str](0)
    assert coll.get("sdk::sub").content_as[dict] == {
        "name": "x", "tags": ["a", "b"], "n": 5, "addr": {"city": "Paris"}}
