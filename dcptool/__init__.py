"""dcptool: back up, restore and inspect Couchbase-style data nodes through DCP."""
from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("dcptool")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
