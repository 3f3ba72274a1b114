"""Parse vbucket lists such as `0-15,512` (used by every command that takes --vbuckets)."""
from __future__ import annotations

from dcptool.errors import UsageError

MAX_VBUCKET = 0xFFFF


def parse_vbuckets(text: str | None, *, limit: int | None = None,
                   option: str = "--vbuckets", whose: str = "the bucket") -> list[int] | None:
    """`0-15,512` -> [0, 1, ..., 15, 512] (sorted, without duplicates). None/"" -> None (all).

    `limit` is the number of vbuckets the bucket (or archive: `whose`) has; ids must be
    below it. Raises UsageError naming the bad part.
    """
    if text is None:
        return None
    text = text.strip()
    if not text or text.lower() == "all":
        return None
    top = (limit - 1) if limit else MAX_VBUCKET
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise UsageError(f"{option}: empty item in '{text}'")
        lo_s, dash, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if dash else lo
        except ValueError:
            raise UsageError(f"{option}: '{part}' is not a vbucket number or a range like 0-15") from None
        if lo < 0 or hi < 0:
            raise UsageError(f"{option}: '{part}' is negative")
        if hi < lo:
            raise UsageError(f"{option}: range '{part}' goes backwards")
        if hi > top:
            if limit:
                check_vbuckets(range(max(lo, limit), hi + 1), limit, option=option, whose=whose)
            raise UsageError(f"{option}: vbucket {hi} is out of range (0-{top})")
        out.update(range(lo, hi + 1))
    return sorted(out)


def check_vbuckets(vbs, count: int, *, option: str = "--vbuckets",
                   whose: str = "the bucket") -> None:
    """Refuse (UsageError, exit 2) vbuckets that `whose` (with `count` vbuckets) does not
    have: a list naming them would otherwise select nothing, silently."""
    if vbs is None or not count:
        return
    over = [vb for vb in vbs if vb >= count]
    if over:
        shown = format_vbuckets(over)
        raise UsageError(f"{option}: {whose} has {count} vbuckets (0-{count - 1}); "
                         f"{'vbucket' if len(over) == 1 else 'vbuckets'} {shown} "
                         f"{'does' if len(over) == 1 else 'do'} not exist",
                         hint=f"name vbuckets 0-{count - 1}")


def format_vbuckets(vbs) -> str:
    """The inverse: [0, 1, 2, 5] -> `0-2,5`."""
    vbs = sorted(set(vbs))
    parts = []
    i = 0
    while i < len(vbs):
        j = i
        while j + 1 < len(vbs) and vbs[j + 1] == vbs[j] + 1:
            j += 1
        parts.append(str(vbs[i]) if i == j else f"{vbs[i]}-{vbs[j]}")
        i = j + 1
    return ",".join(parts)
