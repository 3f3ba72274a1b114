"""dcptool: back up, restore and inspect Couchbase-style data nodes through DCP."""
from importlib.metadata import PackageNotFoundError, distribution


def _installed_version() -> str:
    """The installed distribution's version, read off its METADATA's header (what
    importlib.metadata.version gives, without parsing the whole file as a message); an
    egg-info directory (an editable install's build, found first from the checkout's root)
    has PKG-INFO instead."""
    try:
        dist = distribution("dcptool")
    except PackageNotFoundError:  # running from a source tree without installing
        return "0.0.0"
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    for line in text.splitlines():
        if not line:  # the end of the headers
            break
        if line.startswith("Version:"):
            return line.partition(":")[2].strip()
    return "0.0.0"


__version__ = _installed_version()
