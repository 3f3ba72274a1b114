"""Fixtures shared by the cluster tests."""
from __future__ import annotations

import pytest

from clusterutil import start_nodes, stop_nodes

#: vbuckets of the nodes `abc` starts
ABC_VBUCKETS = 4


@pytest.fixture
def abc(tmp_path):
    """Three node processes a, b and c (not yet a cluster)."""
    nodes = start_nodes(tmp_path, ["a", "b", "c"], vbuckets=ABC_VBUCKETS)
    yield nodes
    stop_nodes(nodes)
