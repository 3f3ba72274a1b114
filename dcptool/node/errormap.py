"""The error map GET_ERROR_MAP returns: every status the node may send, with attributes.

Clients (cbstats, SDKs) fetch it after negotiating XERROR and use the attributes to
decide what to do with a status they do not know by number. Version 2 adds retry
specifications to the statuses a client should retry.
"""
from __future__ import annotations

import json

REVISION = 2

# code: (name, description, attributes)
_ERRORS: dict[int, tuple[str, str, list[str]]] = {
    0x00: ("SUCCESS", "Success", ["success"]),
    0x01: ("KEY_ENOENT", "Not Found", ["item-only"]),
    0x02: ("KEY_EEXISTS", "key already exists, or CAS mismatch", ["item-only"]),
    0x03: ("E2BIG", "Value is too big", ["item-only", "invalid-input"]),
    0x04: ("EINVAL", "Invalid packet", ["internal", "invalid-input"]),
    0x05: ("NOT_STORED", "Not Stored", ["item-only"]),
    0x06: ("DELTA_BADVAL", "Existing document not a number", ["item-only", "invalid-input"]),
    0x07: ("NOT_MY_VBUCKET", "Server does not know about this vBucket",
           ["fetch-config", "invalid-input"]),
    0x08: ("NO_BUCKET", "Not connected to a bucket", ["conn-state-invalidated", "invalid-input"]),
    0x09: ("LOCKED", "Requested resource is locked", ["item-locked", "item-only", "retry-later"]),
    0x0a: ("DCP_STREAMID_INVALID_OR_NOT_FOUND", "No stream for the given stream id",
           ["dcp", "invalid-input"]),
    0x0b: ("OPAQUE_NO_MATCH", "Opaque does not match the stream", ["dcp", "invalid-input"]),
    0x0e: ("NOT_LOCKED", "Document is not locked", ["item-only"]),
    0x0f: ("CAS_VALUE_INVALID", "Invalid CAS value", ["item-only", "invalid-input"]),
    0x1f: ("AUTH_STALE", "Authentication stale, please reauthenticate",
           ["auth", "conn-state-invalidated"]),
    0x20: ("AUTH_ERROR", "Authentication failed", ["auth", "conn-state-invalidated"]),
    0x21: ("AUTH_CONTINUE", "Continue authentication", ["auth", "special-handling"]),
    0x22: ("ERANGE", "Range error", ["invalid-input"]),
    0x23: ("ROLLBACK", "Rollback required", ["dcp", "special-handling"]),
    0x24: ("EACCESS", "No access", ["support"]),
    0x25: ("NOT_INITIALIZED", "Node not initialized", ["retry-later", "temp"]),
    0x80: ("UNKNOWN_FRAME_INFO", "Unknown frame info", ["internal", "invalid-input"]),
    0x81: ("UNKNOWN_COMMAND", "Unknown command", ["internal", "support"]),
    0x82: ("ENOMEM", "Out of memory", ["retry-later", "temp"]),
    0x83: ("NOT_SUPPORTED", "Not supported", ["support"]),
    0x84: ("EINTERNAL", "Internal error", ["internal"]),
    0x85: ("EBUSY", "Server too busy", ["retry-later", "temp"]),
    0x86: ("ETMPFAIL", "Temporary failure", ["retry-later", "temp"]),
    0x87: ("XATTR_EINVAL", "Invalid XATTR section", ["invalid-input"]),
    0x88: ("UNKNOWN_COLLECTION", "Unknown collection", ["fetch-config", "invalid-input"]),
    0x8c: ("UNKNOWN_SCOPE", "Unknown scope", ["fetch-config", "invalid-input"]),
    0x8d: ("DCP_STREAMID_INVALID", "Invalid request with a DCP stream id", ["dcp", "invalid-input"]),
    # sub-document statuses (dcptool.node.commands.subdoc)
    0xc0: ("SUBDOC_PATH_ENOENT", "Subdoc: Path does not exist", ["item-only", "subdoc"]),
    0xc1: ("SUBDOC_PATH_MISMATCH", "Subdoc: Path mismatch", ["item-only", "subdoc"]),
    0xc2: ("SUBDOC_PATH_EINVAL", "Subdoc: Invalid path", ["invalid-input", "subdoc"]),
    0xc3: ("SUBDOC_PATH_E2BIG", "Subdoc: Path too large", ["invalid-input", "subdoc"]),
    0xc4: ("SUBDOC_DOC_E2DEEP", "Subdoc: Document too deep", ["item-only", "subdoc"]),
    0xc5: ("SUBDOC_VALUE_CANTINSERT", "Subdoc: Cannot insert specified value",
           ["invalid-input", "subdoc"]),
    0xc6: ("SUBDOC_DOC_NOT_JSON", "Subdoc: Existing document not JSON", ["item-only", "subdoc"]),
    0xc7: ("SUBDOC_NUM_ERANGE", "Subdoc: Existing number outside valid arithmetic range",
           ["item-only", "subdoc"]),
    0xc8: ("SUBDOC_DELTA_ERANGE", "Subdoc: Delta is 0, not a number, or outside the range",
           ["invalid-input", "subdoc"]),
    0xc9: ("SUBDOC_PATH_EEXISTS", "Subdoc: Document path already exists", ["item-only", "subdoc"]),
    0xca: ("SUBDOC_VALUE_ETOODEEP", "Subdoc: Inserting value would make document too deep",
           ["invalid-input", "subdoc"]),
    0xcb: ("SUBDOC_INVALID_COMBO", "Subdoc: Invalid combination for multi-path command",
           ["invalid-input", "subdoc"]),
    0xcc: ("SUBDOC_MULTI_PATH_FAILURE", "Subdoc: One or more paths in a multi-path command "
           "failed", ["subdoc"]),
    0xcd: ("SUBDOC_SUCCESS_DELETED", "Subdoc: Operation completed successfully on a deleted "
           "document", ["success", "subdoc"]),
    0xce: ("SUBDOC_XATTR_INVALID_FLAG_COMBO", "Subdoc: Invalid combination of xattr flags",
           ["invalid-input", "subdoc"]),
    0xcf: ("SUBDOC_XATTR_INVALID_KEY_COMBO", "Subdoc: Invalid combination of xattr keys",
           ["invalid-input", "subdoc"]),
    0xd0: ("SUBDOC_XATTR_UNKNOWN_MACRO", "Subdoc: Unknown macro", ["invalid-input", "subdoc"]),
    0xd1: ("SUBDOC_XATTR_UNKNOWN_VATTR", "Subdoc: Unknown virtual attribute",
           ["invalid-input", "subdoc"]),
    0xd2: ("SUBDOC_XATTR_CANT_MODIFY_VATTR", "Subdoc: Cannot modify virtual attribute",
           ["invalid-input", "subdoc"]),
    0xd3: ("SUBDOC_MULTI_PATH_FAILURE_DELETED", "Subdoc: One or more paths in a multi-path "
           "command failed on a deleted document", ["subdoc"]),
    0xd4: ("SUBDOC_INVALID_XATTR_ORDER", "Subdoc: Invalid XATTR order (xattrs should come "
           "first)", ["invalid-input", "subdoc"]),
}

_RETRY = {
    0x09: {"strategy": "exponential", "interval": 2, "after": 1, "max-duration": 500,
           "ceil": 100},
    0x25: {"strategy": "constant", "interval": 100, "after": 100, "max-duration": 5000},
    0x82: {"strategy": "exponential", "interval": 2, "after": 1, "max-duration": 500,
           "ceil": 100},
    0x85: {"strategy": "exponential", "interval": 2, "after": 1, "max-duration": 500,
           "ceil": 100},
    0x86: {"strategy": "exponential", "interval": 2, "after": 1, "max-duration": 500,
           "ceil": 100},
}


def error_map(version: int) -> dict:
    """The error map of `version` (1 or 2; higher requests get 2)."""
    version = 2 if version >= 2 else 1
    errors = {}
    for code, (name, desc, attrs) in sorted(_ERRORS.items()):
        entry: dict = {"name": name, "desc": desc, "attrs": list(attrs)}
        if version >= 2 and code in _RETRY:
            entry["attrs"] = attrs + ["auto-retry"] if "auto-retry" not in attrs else attrs
            entry["retry"] = dict(_RETRY[code])
        errors[format(code, "x")] = entry
    return {"version": version, "revision": REVISION, "errors": errors}


def error_map_json(version: int) -> bytes:
    return json.dumps(error_map(version), separators=(",", ":")).encode()
