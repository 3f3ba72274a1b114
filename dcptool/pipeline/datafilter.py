"""`--include-data`, `--exclude-data` and `--map-data`: which collections a job takes and
where a restore puts them.

Names on the command line (comma-separated lists, options repeatable):

* include/exclude: `bucket.scope.collection` or `bucket.scope`; the bucket must be the one
  the job works on.
* map: `SRC=DST` with `scope.collection=scope.collection` or `scope=scope`, each side
  optionally prefixed with the bucket: `bucket.scope.collection`, and `bucket.scope` when
  the other side is a bare scope (otherwise a two-part name is `scope.collection`). A
  collection mapping wins over its scope's mapping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from dcptool.errors import UsageError

#: (scope, collection) or (scope, None) for a whole scope
Name = tuple[str, "str | None"]


def _split_list(values: Iterable[str] | str | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    out = []
    for v in values:
        out.extend(p.strip() for p in str(v).split(",") if p.strip())
    return out


def show(name: Name) -> str:
    return name[0] if name[1] is None else f"{name[0]}.{name[1]}"


def parse_data_names(values: Iterable[str] | str | None, bucket: str, option: str) -> list[Name]:
    """`bucket.scope.collection` / `bucket.scope` names of a list option. UsageError for a
    malformed name or another bucket."""
    out: list[Name] = []
    for text in _split_list(values):
        parts = text.split(".")
        if len(parts) not in (2, 3) or not all(parts):
            raise UsageError(f"{option}: {text!r} is not bucket.scope or bucket.scope.collection")
        if parts[0] != bucket:
            raise UsageError(f"{option}: {text!r} names bucket {parts[0]!r}, not {bucket!r}")
        out.append((parts[1], parts[2] if len(parts) == 3 else None))
    return out


def parse_map(values: Iterable[str] | str | None, src_bucket: str, dst_bucket: str
              ) -> list[tuple[Name, Name]]:
    """`--map-data` pairs. UsageError for a malformed pair, a scope mapped to a collection
    (or back), or a bucket prefix that is not the job's bucket."""
    out: list[tuple[Name, Name]] = []
    for text in _split_list(values):
        src, sep, dst = text.partition("=")
        if not sep or not src.strip() or not dst.strip():
            raise UsageError(f"--map-data: {text!r} is not SRC=DST")
        src, dst = src.strip(), dst.strip()
        # `bucket.scope=scope` (or the other way round): a two-part side next to a one-part
        # side is bucket.scope when it starts with the bucket
        ns, nd = src.count("."), dst.count(".")
        if ns == 1 and nd == 0 and src.split(".")[0] == src_bucket:
            src = src.split(".", 1)[1]
        elif nd == 1 and ns == 0 and dst.split(".")[0] == dst_bucket:
            dst = dst.split(".", 1)[1]
        a = _map_name(src, src_bucket, text)
        b = _map_name(dst, dst_bucket, text)
        if (a[1] is None) != (b[1] is None):
            raise UsageError(f"--map-data: {text!r} maps a scope to a collection (map "
                             "scope=scope or scope.collection=scope.collection)")
        out.append((a, b))
    return out


def _map_name(text: str, bucket: str, whole: str) -> Name:
    parts = text.split(".")
    if not all(parts) or len(parts) > 3:
        raise UsageError(f"--map-data: {whole!r}: {text!r} is not scope or scope.collection")
    if len(parts) == 3:
        if parts[0] != bucket:
            raise UsageError(f"--map-data: {whole!r} names bucket {parts[0]!r}, not {bucket!r}")
        parts = parts[1:]
    return (parts[0], parts[1] if len(parts) == 2 else None)


@dataclass(frozen=True)
class DataSelection:
    """Include/exclude lists and the mapping, parsed."""

    include: tuple[Name, ...] = ()
    exclude: tuple[Name, ...] = ()
    mapping: tuple[tuple[Name, Name], ...] = ()

    @property
    def everything(self) -> bool:
        return not self.include and not self.exclude

    def selects(self, scope: str, collection: str) -> bool:
        if self.include and not any(_matches(n, scope, collection) for n in self.include):
            return False
        return not any(_matches(n, scope, collection) for n in self.exclude)

    def target(self, scope: str, collection: str) -> tuple[str, str]:
        """Where `scope.collection` goes: a collection mapping, else its scope's, else the
        same names."""
        for (s, c), (ts, tc) in self.mapping:
            if c is not None and s == scope and c == collection:
                return ts, tc  # type: ignore[return-value]
        for (s, c), (ts, _tc) in self.mapping:
            if c is None and s == scope:
                return ts, collection
        return scope, collection

    def names(self) -> list[tuple[str, Name]]:
        """(option, name) of every name the user gave on the source side."""
        return ([("--include-data", n) for n in self.include]
                + [("--exclude-data", n) for n in self.exclude]
                + [("--map-data", a) for a, _b in self.mapping])

    def as_json(self) -> dict:
        return {"include": [show(n) for n in self.include],
                "exclude": [show(n) for n in self.exclude],
                "map": {show(a): show(b) for a, b in self.mapping}}


def _matches(name: Name, scope: str, collection: str) -> bool:
    return name[0] == scope and (name[1] is None or name[1] == collection)


def selection(include=None, exclude=None, mapping=None, *, bucket: str,
              target_bucket: str | None = None) -> DataSelection:
    return DataSelection(tuple(parse_data_names(include, bucket, "--include-data")),
                         tuple(parse_data_names(exclude, bucket, "--exclude-data")),
                         tuple(parse_map(mapping, bucket, target_bucket or bucket)))


__all__ = ["DataSelection", "selection", "parse_data_names", "parse_map", "show"]
