"""The archive tests' stores: `where`, a location on each store the archive code has
(tests/archive/test_stores.py proves the store contract with it; any archive test that
imports `where` and `s3_bucket` from here and takes `where` runs on every store,
parametrised)."""
from __future__ import annotations

import secrets

import pytest

from dcptool.archive.stores import MEMORY
from dcptool.archive.stores.s3 import CLIENTS
from s3util import aim_at

#: the stores a `where` is on (tests/archive/test_stores.py maps them to their objects)
STORE_NAMES = ("local", "s3", "memory")


@pytest.fixture(scope="module")
def s3_bucket(s3_server):
    """This process set up for the suite's S3 server (as the `s3` fixture does) and one
    bucket for the module: each test takes a prefix of its own, and the S3 client is made
    once."""
    mp = pytest.MonkeyPatch()
    aim_at(mp, s3_server)
    yield s3_server.new_bucket()
    mp.undo()
    CLIENTS.clear()


@pytest.fixture(params=STORE_NAMES)
def where(request, tmp_path):
    """A location (as a user names it) on one store, where nothing is yet."""
    if request.param == "local":
        yield str(tmp_path / "store")
    elif request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        yield f"s3://{bucket}/{secrets.token_hex(4)}/store"
    else:
        name = f"t-{secrets.token_hex(4)}"
        yield f"mem://{name}/store"
        MEMORY.clear(name)
