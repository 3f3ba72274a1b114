"""Sub-document operations on a JSON value, as kv_engine's subdoc commands define them
(kv_engine docs/SubDocument.md): pure functions of a parsed document, a path and a value,
with no I/O. `dcptool.node.commands.subdoc` reads the document, applies a list of these
and stores the result as one new version.

**Paths** are N1QL-style, as kv_engine's subjson parses them: components separated by
`.`, array indexes in brackets right after the array (`a.b[0][2].c`), `[-1]` for the last
element, a component between backticks taken literally (`` `dot.ted` ``, a literal backtick
doubled). The empty path is the whole document. At most 32 components and 1,024 bytes;
anything else is PATH_EINVAL or PATH_E2BIG.

**Values** are parsed with Python's json module and written back compactly: a value a
lookup returns is the JSON of the element (numbers and strings as Python writes them,
e.g. `1.50` comes back as `1.5`), not a slice of the stored text.

Errors are `SubdocError(status)` with kv_engine's status codes: PATH_ENOENT (a component
is missing), PATH_MISMATCH (a component treats a value as the wrong kind of container),
PATH_EEXISTS, VALUE_CANTINSERT (the value is not JSON, or not what the operation may
insert), DOC_NOT_JSON, DOC_E2DEEP, NUM_ERANGE, DELTA_ERANGE (a counter leaving int64, or
a delta that is 0 or not an integer).
"""
from __future__ import annotations

import json
from typing import Any

# statuses (kv_engine's cb::mcbp::Status)
PATH_ENOENT = 0xC0
PATH_MISMATCH = 0xC1
PATH_EINVAL = 0xC2
PATH_E2BIG = 0xC3
DOC_E2DEEP = 0xC4
VALUE_CANTINSERT = 0xC5
DOC_NOT_JSON = 0xC6
NUM_ERANGE = 0xC7
DELTA_ERANGE = 0xC8
PATH_EEXISTS = 0xC9
VALUE_ETOODEEP = 0xCA

#: kv_engine's limits (subjson MAX_COMPONENTS, SUBDOC_MAX_PATH_LENGTH); the depth limit
#: is subjson's nesting limit
MAX_COMPONENTS = 32
MAX_PATH = 1024
MAX_DEPTH = 32
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

#: an array index component; LAST is `[-1]`
LAST = -1


class SubdocError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(hex(status))
        self.status = status


class Index(int):
    """A path component that is an array index (a plain str is a dictionary key)."""


def parse_path(path: bytes | str) -> list:
    """The components of `path`: `str` dictionary keys and `Index` array indexes."""
    if isinstance(path, bytes):
        if len(path) > MAX_PATH:
            raise SubdocError(PATH_E2BIG)
        try:
            path = path.decode()
        except UnicodeDecodeError:
            raise SubdocError(PATH_EINVAL) from None
    elif len(path.encode()) > MAX_PATH:
        raise SubdocError(PATH_E2BIG)
    out: list = []
    i, n = 0, len(path)
    expect_key = True  # at the start or after a dot: a key (or an index at the very start)
    while i < n:
        c = path[i]
        if c == "[":
            if expect_key and out:
                raise SubdocError(PATH_EINVAL)  # "a.[0]"
            j = path.find("]", i)
            if j < 0:
                raise SubdocError(PATH_EINVAL)
            text = path[i + 1:j]
            if not text or not (text.isdigit() or text == "-1"):
                raise SubdocError(PATH_EINVAL)
            out.append(Index(int(text)))
            i = j + 1
            expect_key = False
            if i < n and path[i] not in ".[":
                raise SubdocError(PATH_EINVAL)
            if i < n and path[i] == ".":
                i += 1
                expect_key = True
                if i == n:
                    raise SubdocError(PATH_EINVAL)
            continue
        if c == "`":
            buf = []
            i += 1
            while True:
                if i >= n:
                    raise SubdocError(PATH_EINVAL)
                if path[i] == "`":
                    if i + 1 < n and path[i + 1] == "`":
                        buf.append("`")
                        i += 2
                        continue
                    i += 1
                    break
                buf.append(path[i])
                i += 1
            key = "".join(buf)
        else:
            j = i
            while j < n and path[j] not in ".[]`":
                j += 1
            if j < n and path[j] in "]`":
                raise SubdocError(PATH_EINVAL)
            key = path[i:j]
            i = j
        if not key:
            raise SubdocError(PATH_EINVAL)
        out.append(key)
        expect_key = False
        if i < n:
            if path[i] == ".":
                i += 1
                expect_key = True
                if i == n:
                    raise SubdocError(PATH_EINVAL)
            elif path[i] != "[":
                raise SubdocError(PATH_EINVAL)
        if len(out) > MAX_COMPONENTS:
            raise SubdocError(PATH_E2BIG)
    if len(out) > MAX_COMPONENTS:
        raise SubdocError(PATH_E2BIG)
    return out


def parse_document(body: bytes) -> Any:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise SubdocError(DOC_NOT_JSON) from None
    if _depth(doc) > MAX_DEPTH:
        raise SubdocError(DOC_E2DEEP)
    return doc


def parse_value(value: bytes, *, multi: bool = False) -> list:
    """The JSON values of an operation's value: one value, or for array insertions
    (`multi`) a comma-separated list of them (`1, "a", [2]`). VALUE_CANTINSERT when the
    text is not that."""
    try:
        text = value.decode()
        vals = json.loads("[" + text + "]") if multi else [json.loads(text)]
    except (ValueError, UnicodeDecodeError):
        raise SubdocError(VALUE_CANTINSERT) from None
    if multi and not vals:
        raise SubdocError(VALUE_CANTINSERT)
    return vals


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _depth(v: Any, d: int = 0) -> int:
    if isinstance(v, dict):
        return max((_depth(x, d + 1) for x in v.values()), default=d + 1)
    if isinstance(v, list):
        return max((_depth(x, d + 1) for x in v), default=d + 1)
    return d


def _child(container: Any, comp) -> Any:
    """The element `comp` names inside `container` (PATH_MISMATCH / PATH_ENOENT)."""
    if isinstance(comp, Index):
        if not isinstance(container, list):
            raise SubdocError(PATH_MISMATCH)
        if comp == LAST:
            if not container:
                raise SubdocError(PATH_ENOENT)
            return container[-1]
        if comp >= len(container):
            raise SubdocError(PATH_ENOENT)
        return container[comp]
    if not isinstance(container, dict):
        raise SubdocError(PATH_MISMATCH)
    if comp not in container:
        raise SubdocError(PATH_ENOENT)
    return container[comp]


def find(doc: Any, comps: list) -> Any:
    v = doc
    for c in comps:
        v = _child(v, c)
    return v


def _parent(doc: Any, comps: list, mkdir_p: bool) -> Any:
    """The container of the last component, creating missing dictionaries on the way with
    `mkdir_p` (never array elements)."""
    v = doc
    for c in comps[:-1]:
        try:
            v = _child(v, c)
        except SubdocError as e:
            if e.status != PATH_ENOENT or not mkdir_p or isinstance(c, Index):
                raise
            v[c] = {}
            v = v[c]
    return v


# -- lookups -----------------------------------------------------------------------------


def op_get(doc: Any, comps: list) -> bytes:
    return dumps(find(doc, comps))


def op_exists(doc: Any, comps: list) -> None:
    find(doc, comps)


def op_get_count(doc: Any, comps: list) -> bytes:
    v = find(doc, comps)
    if not isinstance(v, (dict, list)):
        raise SubdocError(PATH_MISMATCH)
    return b"%d" % len(v)


# -- mutations (change `doc` in place; return a value to answer, or None) ---------------


def _check_depth(doc: Any, comps: list, vals: list) -> None:
    if len(comps) + max((_depth(v) for v in vals), default=0) > MAX_DEPTH:
        raise SubdocError(VALUE_ETOODEEP)


def op_dict_add(doc: Any, comps: list, value: bytes, *, mkdir_p: bool, upsert: bool = False):
    if not comps or isinstance(comps[-1], Index):
        raise SubdocError(PATH_EINVAL)
    (val,) = parse_value(value)
    _check_depth(doc, comps, [val])
    parent = _parent(doc, comps, mkdir_p)
    if not isinstance(parent, dict):
        raise SubdocError(PATH_MISMATCH)
    if not upsert and comps[-1] in parent:
        raise SubdocError(PATH_EEXISTS)
    parent[comps[-1]] = val
    return None


def op_replace(doc: Any, comps: list, value: bytes):
    if not comps:
        raise SubdocError(PATH_EINVAL)
    (val,) = parse_value(value)
    _check_depth(doc, comps, [val])
    parent = _parent(doc, comps, False)
    last = comps[-1]
    _child(parent, last)  # must exist
    if isinstance(last, Index):
        parent[-1 if last == LAST else last] = val
    else:
        parent[last] = val
    return None


def op_delete(doc: Any, comps: list):
    if not comps:
        raise SubdocError(PATH_EINVAL)
    parent = _parent(doc, comps, False)
    last = comps[-1]
    _child(parent, last)
    if isinstance(last, Index):
        del parent[-1 if last == LAST else last]
    else:
        del parent[last]
    return None


def _array_at(doc: Any, comps: list, mkdir_p: bool) -> list:
    """The array `comps` names; with `mkdir_p` a missing last key becomes a new array."""
    if not comps:
        arr = doc
    else:
        parent = _parent(doc, comps, mkdir_p)
        try:
            arr = _child(parent, comps[-1])
        except SubdocError as e:
            if e.status != PATH_ENOENT or not mkdir_p or isinstance(comps[-1], Index):
                raise
            parent[comps[-1]] = arr = []
    if not isinstance(arr, list):
        raise SubdocError(PATH_MISMATCH)
    return arr


def op_array_push(doc: Any, comps: list, value: bytes, *, first: bool, mkdir_p: bool):
    vals = parse_value(value, multi=True)
    _check_depth(doc, comps + [Index(0)], vals)
    arr = _array_at(doc, comps, mkdir_p)
    if first:
        arr[0:0] = vals
    else:
        arr.extend(vals)
    return None


def op_array_insert(doc: Any, comps: list, value: bytes):
    if not comps or not isinstance(comps[-1], Index):
        raise SubdocError(PATH_EINVAL)
    if comps[-1] == LAST:
        raise SubdocError(PATH_EINVAL)
    vals = parse_value(value, multi=True)
    _check_depth(doc, comps, vals)
    arr = _array_at(doc, comps[:-1], False)
    pos = comps[-1]
    if pos > len(arr):
        raise SubdocError(PATH_ENOENT)
    arr[pos:pos] = vals
    return None


def _primitive(v: Any) -> bool:
    return not isinstance(v, (dict, list))


def op_array_add_unique(doc: Any, comps: list, value: bytes, *, mkdir_p: bool):
    vals = parse_value(value, multi=True)
    if len(vals) != 1 or not _primitive(vals[0]):
        raise SubdocError(VALUE_CANTINSERT)
    arr = _array_at(doc, comps, mkdir_p)
    if not all(_primitive(x) for x in arr):
        raise SubdocError(PATH_MISMATCH)
    # uniqueness by the JSON text: "1" is not 1, 1.0 is not 1, true is not 1
    new = dumps(vals[0])
    if any(dumps(x) == new for x in arr):
        raise SubdocError(PATH_EEXISTS)
    arr.append(vals[0])
    return None


def op_counter(doc: Any, comps: list, value: bytes, *, mkdir_p: bool) -> bytes:
    if not comps:
        raise SubdocError(PATH_EINVAL)
    try:
        text = value.decode().strip()
        delta = int(text)
    except (ValueError, UnicodeDecodeError):
        raise SubdocError(DELTA_ERANGE) from None
    if delta == 0 or not INT64_MIN <= delta <= INT64_MAX or text.startswith("+"):
        raise SubdocError(DELTA_ERANGE)
    parent = _parent(doc, comps, mkdir_p)
    last = comps[-1]
    try:
        cur = _child(parent, last)
    except SubdocError as e:
        if e.status != PATH_ENOENT or isinstance(last, Index):
            raise
        cur = 0
    if isinstance(cur, bool) or not isinstance(cur, int):
        raise SubdocError(PATH_MISMATCH)
    if not INT64_MIN <= cur <= INT64_MAX:
        raise SubdocError(NUM_ERANGE)
    new = cur + delta
    if not INT64_MIN <= new <= INT64_MAX:
        raise SubdocError(DELTA_ERANGE)
    if isinstance(last, Index):
        parent[-1 if last == LAST else last] = new
    else:
        if not isinstance(parent, dict):
            raise SubdocError(PATH_MISMATCH)
        parent[last] = new
    return b"%d" % new


def root_for(opcode_is_array: bool, comps: list) -> Any:
    """The empty root a missing document starts from (MKDOC/ADD): an array for an array
    operation on the empty path or a path that starts with an index, else a dictionary."""
    if (opcode_is_array and not comps) or (comps and isinstance(comps[0], Index)):
        return []
    return {}
