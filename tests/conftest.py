"""Shared test fixtures."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: the captured client vectors and the protocol fact sheet live beside the repository
SHARED = Path(os.environ.get("DCPTOOL_SHARED", REPO.parent / "shared"))
VECTORS = SHARED / "protocol" / "vectors"


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    if not VECTORS.is_dir():
        pytest.fail(f"protocol vectors not found at {VECTORS} (set DCPTOOL_SHARED)")
    return VECTORS


@pytest.fixture(scope="session")
def spark():
    """The one local SparkSession of the test run (Spark start-up costs seconds)."""
    from dcptool.pipeline.spark import get_spark

    session = get_spark("local[2]", app_name="dcptool-tests")
    yield session
    session.stop()
