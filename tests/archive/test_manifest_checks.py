"""The manifest checker's test of `unchanged` ranges against the vbuckets a manifest lists:
found at either end of a range, not beside it, and without walking a range vbucket by
vbucket."""
from __future__ import annotations

from dcptool.archive.manifest import _overlaps


def test_a_listed_vbucket_inside_an_unchanged_range_is_found_at_either_end():
    listed = [3, 10, 11, 500]
    assert _overlaps([[0, 2], [3, 3]], listed)
    assert _overlaps([[4, 10]], listed)
    assert _overlaps([[12, 600]], listed)
    assert not _overlaps([[0, 2], [4, 9], [12, 499], [501, 1023]], listed)
    assert not _overlaps([[0, 1023]], [])


def test_ranges_are_not_walked_vbucket_by_vbucket():
    """A range as wide as a u64 (a damaged manifest of an archive whose vbucket count is not
    known) is answered, not walked (walking it would not end)."""
    assert not _overlaps([[2000, 2**64 - 1]], list(range(1024)))
    assert _overlaps([[0, 2**64 - 1]], [7])
    assert not _overlaps([[i, i] for i in range(1024, 2048)], list(range(1024)))
