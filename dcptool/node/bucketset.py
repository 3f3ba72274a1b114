"""The buckets of a node, their settings and where their data lives.

A node holds many buckets, as Couchbase Server does. The first one, named by `--bucket`
(default "default"), is created at start and keeps its data where a one-bucket node
always had it, so an existing data directory opens unchanged:

    DIR/data.sqlite3                 the first bucket (vbuckets, items, manifest, HWT, meta)
    DIR/buckets/NAME/data.sqlite3    every other bucket, created over REST
    DIR/buckets.json                 the registry: every bucket's uuid and settings

`buckets.json` is {"buckets": {NAME: {"uuid": HEX, "settings": {...}}}}; settings use
Couchbase Server's REST names (bucketType, ramQuota in bytes, replicaNumber,
evictionPolicy, maxTTL, compressionMode, conflictResolutionType, durabilityMinLevel,
numVBuckets, flushEnabled). A directory without the file is a one-bucket node: the first
bucket's settings then come from the node's options. The file is written whole
(write-and-rename) after every create, edit and drop. A dropped bucket's directory is
removed; a bucket created again with the same name gets a new uuid.

What takes effect: maxTTL (`commands.common.cap_expiry`: a document written without
expiry, or with a later one, in a collection without its own maxTTL expires maxTTL seconds
after the write, as Couchbase Server applies a bucket's maxTTL), evictionPolicy and
ramQuota (the bucket's eviction; an edit restarts the bucket, as Couchbase Server does: its
connections are closed and it opens again under the new policy; the first bucket's are the
node's --eviction and --memory-quota), numVBuckets.
The others are kept and returned as given.
"""
from __future__ import annotations

import json
import os
import re
import uuid as uuidlib
from pathlib import Path
from typing import Any

REGISTRY_FILE = "buckets.json"
BUCKETS_DIR = "buckets"

#: Couchbase Server's limits on a bucket name
MAX_BUCKET_NAME = 100
_NAME_RE = re.compile(r"^[A-Za-z0-9_.%-]+$")

EVICTION_POLICIES = ("valueOnly", "fullEviction")
COMPRESSION_MODES = ("off", "passive", "active")
CONFLICT_RESOLUTION = ("seqno", "lww")
DURABILITY_LEVELS = ("none", "majority", "majorityAndPersistActive", "persistToMajority")
BUCKET_TYPES = ("couchbase", "membase")
#: the smallest ramQuota (MiB) Couchbase Server accepts for a couchbase bucket
MIN_RAM_QUOTA_MB = 100
#: the vbucket counts Couchbase Server 8 offers (this node also accepts its own default)
VBUCKET_COUNTS = (64, 128, 1024)
#: settings an edit may not change (Couchbase Server answers 400 for each)
FIXED = ("bucketType", "conflictResolutionType", "numVBuckets")
MAX_TTL = 2147483647


class SettingsError(ValueError):
    """Invalid settings: {field: message} as Couchbase Server words them."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def default_settings(config) -> dict[str, Any]:
    """The settings of a bucket made from the node's options."""
    return {
        "bucketType": "membase",
        "ramQuota": int(config.memory_quota),
        "replicaNumber": 0,
        "evictionPolicy": "fullEviction" if config.eviction == "full" else "valueOnly",
        "maxTTL": 0,
        "compressionMode": "passive",
        "conflictResolutionType": "seqno",
        "durabilityMinLevel": "none",
        "numVBuckets": int(config.vbuckets),
        "flushEnabled": False,
    }


def valid_bucket_name(name: str) -> str | None:
    """None when `name` is a valid bucket name, else Couchbase Server's message."""
    if not name:
        return "Bucket name cannot be empty"
    if len(name) > MAX_BUCKET_NAME:
        return f"Bucket name cannot exceed {MAX_BUCKET_NAME} characters"
    if name.startswith("."):
        return "Bucket name cannot start with dot."
    if not _NAME_RE.match(name):
        return ("Bucket name can only contain characters in range A-Z, a-z, 0-9 as well as "
                "underscore, period, dash & percent. Consult the documentation.")
    return None


def _int(form, field: str, errors: dict[str, str], lo: int, hi: int, msg: str) -> int | None:
    raw = form.get(field)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        errors[field] = msg
        return None
    if not lo <= value <= hi:
        errors[field] = msg
        return None
    return value


def _choice(form, field: str, errors: dict[str, str], choices, msg: str) -> str | None:
    raw = form.get(field)
    if raw is None:
        return None
    if str(raw) not in choices:
        errors[field] = msg
        return None
    return str(raw)


def parse_settings(form, base: dict[str, Any], *, create: bool,
                   node_vbuckets: int) -> dict[str, Any]:
    """`base` updated with the form's settings (Couchbase Server's parameter names);
    SettingsError with every invalid field. `create`: a new bucket (every setting may be
    given); otherwise an edit (FIXED ones may not change)."""
    errors: dict[str, str] = {}
    out = dict(base)
    if not create:
        for field in FIXED:
            if field in form and str(form[field]) != str(base.get(field)):
                if field == "conflictResolutionType":
                    errors[field] = "Conflict resolution type not allowed in update bucket"
                elif field == "numVBuckets":
                    errors[field] = "Number of vbuckets cannot be modified"
                elif str(form[field]) not in BUCKET_TYPES or base.get(field) not in BUCKET_TYPES:
                    errors[field] = "Cannot change bucket type."
    else:
        btype = _choice(form, "bucketType", errors, BUCKET_TYPES + ("memcached", "ephemeral"),
                        "invalid bucket type")
        if btype in ("memcached", "ephemeral"):
            errors["bucketType"] = f"{btype} buckets are not supported by this node"
        elif btype is not None:
            out["bucketType"] = "membase"
        crt = _choice(form, "conflictResolutionType", errors, CONFLICT_RESOLUTION,
                      "Conflict resolution type must be 'seqno' or 'lww'")
        if crt is not None:
            out["conflictResolutionType"] = crt
        nvb = _int(form, "numVBuckets", errors, 1, 1024,
                   "Number of vbuckets must be 128 or 1024")
        if nvb is not None:
            if nvb not in VBUCKET_COUNTS and nvb != node_vbuckets:
                errors["numVBuckets"] = "Number of vbuckets must be 64, 128 or 1024"
            else:
                out["numVBuckets"] = nvb
        else:
            out.setdefault("numVBuckets", node_vbuckets)
    quota_field = "ramQuotaMB" if "ramQuotaMB" in form else "ramQuota"
    raw = form.get(quota_field)
    if raw is not None:
        try:
            mb = int(str(raw).strip())
        except ValueError:
            errors["ramQuota"] = "The RAM Quota value must be a number."
        else:
            if mb < MIN_RAM_QUOTA_MB:
                errors["ramQuota"] = (f"RAM quota cannot be less than {MIN_RAM_QUOTA_MB} MiB")
            else:
                out["ramQuota"] = mb * 1024 * 1024
    elif create and "ramQuota" not in base:
        errors["ramQuota"] = "The RAM Quota value must be a number."
    rep = _int(form, "replicaNumber", errors, 0, 3,
               "The replica number must be specified and must be a non-negative integer.")
    if rep is not None:
        out["replicaNumber"] = rep
    ev = _choice(form, "evictionPolicy", errors, EVICTION_POLICIES,
                 "Eviction policy must be either 'valueOnly' or 'fullEviction' for "
                 "couchbase buckets")
    if ev is not None:
        out["evictionPolicy"] = ev
    ttl = _int(form, "maxTTL", errors, 0, MAX_TTL,
               f"Max TTL must be an integer between 0 and {MAX_TTL}")
    if ttl is not None:
        out["maxTTL"] = ttl
    cm = _choice(form, "compressionMode", errors, COMPRESSION_MODES,
                 "compressionMode can be set to 'off', 'passive' or 'active'")
    if cm is not None:
        out["compressionMode"] = cm
    dur = _choice(form, "durabilityMinLevel", errors, DURABILITY_LEVELS,
                  "Durability minimum level must be either 'none', 'majority', "
                  "'majorityAndPersistActive' or 'persistToMajority'")
    if dur is not None:
        out["durabilityMinLevel"] = dur
    fe = _choice(form, "flushEnabled", errors, ("0", "1"), "flushEnabled can only be 1 or 0")
    if fe is not None:
        out["flushEnabled"] = fe == "1"
    if errors:
        raise SettingsError(errors)
    return out


class Registry:
    """DIR/buckets.json: {name: {"uuid": hex, "settings": {...}}} in creation order."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / REGISTRY_FILE
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            doc = json.loads(self.path.read_text())
            self.entries = dict(doc.get("buckets", {}))

    def bucket_dir(self, name: str, first: str) -> Path:
        """Where bucket `name`'s data lives (the data directory itself for the first)."""
        if name == first:
            return self.data_dir
        return self.data_dir / BUCKETS_DIR / name

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"buckets": self.entries}, indent=1) + "\n")
        os.replace(tmp, self.path)

    def put(self, name: str, uuid: str, settings: dict[str, Any]) -> None:
        self.entries[name] = {"uuid": uuid, "settings": dict(settings)}
        self.save()

    def remove(self, name: str) -> None:
        self.entries.pop(name, None)
        self.save()


def new_uuid() -> str:
    return uuidlib.uuid4().hex
