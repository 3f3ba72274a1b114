"""The benchmarks' JSON documents: one generator, deterministic from a seed.

Documents are built like Couchbase's travel sample: routes with schedules, airlines,
airports, hotels with reviews in text of natural word frequencies (Zipf), names, cities,
coordinates, timestamps, booleans, nested objects and arrays, compact JSON. They compress
as real documents do (`zstd -3` takes ~0.9 KB ones to ~0.22 of their size, ~256 B ones to
~0.3-0.4), not as padding does.

- `document(i, r, scale)`: document `i` drawn from `r`; `scale` 1.0 gives the travel-sample
  mix (~0.9 KB on average), smaller scales shorter lists and texts and fewer hotels (more
  airports), down to ~0.2 KB.
- `values(n, size, seed, start)`: documents `start`..`start + n - 1` of the sequence whose
  mean size is ~`size` bytes. The sequence is cut into chunks of `CHUNK` documents, each
  drawn from a generator seeded by (seed, chunk), so that any range (a loader process's
  share, say) is the same documents wherever it is made.
"""
from __future__ import annotations

import functools
import itertools
import json
import random
import time
import uuid

CHUNK = 1024

_WORDS = (
    "the of and to a in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your "
    "how said an each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did number "
    "sound no most people my over know water than call first who may down side been now find "
    "any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form great think say help "
    "low line turn cause much mean before move right old too same tell does set three want air "
    "well also play small end put home read hand port large add even land here must big high "
    "such follow act why ask men change went light kind off need house picture try us again "
    "point world near build self earth head stand own page should country found answer school "
    "grow study still learn plant cover food sun four between state keep eye never last let "
    "thought city tree cross farm hard start might story saw far sea draw left late run while "
    "press close night real life few north room breakfast parking staff clean quiet friendly "
    "comfortable walk station beach view pool restaurant bar wifi location service price value "
    "recommend stay hotel").split()
#: word k (by rank) with weight 1/(k+1): the frequencies of natural text (Zipf)
_CUM = list(itertools.accumulate(1 / (k + 1) for k in range(len(_WORDS))))
_CITIES = [("Paris", "France"), ("London", "United Kingdom"), ("San Francisco", "United States"),
           ("Lyon", "France"), ("Manchester", "United Kingdom"), ("Los Angeles", "United States"),
           ("Nice", "France"), ("Edinburgh", "United Kingdom")]
_FIRST = ("Ann Bob Carl Dora Emil Fay Gus Hana Ivan Jill Kurt Lena Mia Ned Otto Pia Quin Rosa "
          "Sam Tess Uma Vic Wes Xena Yuri Zoe").split()
_LAST = ("Smith Jones Brown Taylor Wilson Davies Evans Thomas Johnson Roberts Walker Wright "
         "Robinson Thompson White Hughes").split()
_AIRPORTS = "CDG ORY LHR LGW SFO LAX NCE EDI MAN LYS JFK AMS FRA MUC BCN MAD FCO DUB".split()
_AIRLINES = [("AF", "Air France"), ("BA", "British Airways"), ("UA", "United Airlines"),
             ("KL", "KLM"), ("LH", "Lufthansa"), ("IB", "Iberia"), ("EI", "Aer Lingus")]
_EQUIPMENT = ["319", "320", "321", "738", "73H", "77W", "388", "E90"]
_TZ = ["Europe/Paris", "Europe/London", "America/Los_Angeles", "America/New_York",
       "Europe/Amsterdam", "Europe/Berlin", "Europe/Madrid", "Europe/Rome", "Europe/Dublin"]


def _text(r: random.Random, n: int) -> str:
    return " ".join(r.choices(_WORDS, cum_weights=_CUM, k=n))


def _person(r: random.Random) -> str:
    return f"{r.choice(_FIRST)} {r.choice(_LAST)}"


def _when(r: random.Random, fmt: str) -> str:
    return time.strftime(fmt, time.gmtime(1_500_000_000 + r.randrange(300_000_000)))


def _n(x: float, scale: float, least: int = 0) -> int:
    return max(least, round(x * scale))


def _route(i: int, r: random.Random, s: float) -> dict:
    code, _ = r.choice(_AIRLINES)
    src, dst = r.sample(_AIRPORTS, 2)
    return {"id": i, "type": "route", "airline": code,
            "airlineid": f"airline_{r.randint(10, 9999)}", "sourceairport": src,
            "destinationairport": dst, "stops": r.choice([0, 0, 0, 1]),
            "equipment": " ".join(r.sample(_EQUIPMENT, r.randint(1, 3))),
            "distance": round(r.uniform(200, 9000), 6),
            "schedule": [{"day": r.randint(0, 6),
                          "utc": f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00",
                          "flight": f"{code}{r.randint(1, 999):03d}"}
                         for _ in range(r.randint(_n(5, s), _n(30, s, 1)))]}


def _airline(i: int, r: random.Random, s: float) -> dict:
    code, name = r.choice(_AIRLINES)
    return {"id": i, "type": "airline", "name": name, "iata": code,
            "icao": code + r.choice("ABCDEFG"), "callsign": name.upper().split()[0],
            "country": r.choice(_CITIES)[1]}


def _airport(i: int, r: random.Random, s: float) -> dict:
    city, country = r.choice(_CITIES)
    faa = r.choice(_AIRPORTS)
    return {"id": i, "type": "airport", "airportname": f"{city} {_text(r, 1).title()}",
            "city": city, "country": country, "faa": faa, "icao": "L" + faa,
            "tz": r.choice(_TZ),
            "geo": {"lat": round(r.uniform(-60, 60), 6), "lon": round(r.uniform(-180, 180), 6),
                    "alt": r.randint(0, 2000)}}


def _hotel(i: int, r: random.Random, s: float) -> dict:
    city, country = r.choice(_CITIES)
    return {
        "id": i, "type": "hotel",
        "name": _text(r, r.randint(1, 3)).title() + " " + r.choice(["Hotel", "Inn", "Lodge"]),
        "address": f"{r.randint(1, 400)} {_text(r, 2).title()} "
                   f"{r.choice(['Street', 'Road', 'Avenue'])}",
        "city": city, "country": country,
        "phone": f"+{r.randint(1, 99)} {r.randint(100, 999)} {r.randint(1000, 9999)}",
        "email": f"info@{_text(r, 1)}{i % 1000}.example.com" if r.random() < 0.6 else None,
        "geo": {"lat": round(r.uniform(-60, 60), 6), "lon": round(r.uniform(-180, 180), 6),
                "accuracy": r.choice(["ROOFTOP", "RANGE_INTERPOLATED", "APPROXIMATE"])},
        "price": round(r.uniform(40, 400), 2), "vacancy": r.random() < 0.5,
        "pets_ok": r.random() < 0.3, "free_breakfast": r.random() < 0.5,
        "free_internet": r.random() < 0.7,
        "description": _text(r, r.randint(_n(10, s, 1), _n(60, s, 1))).capitalize() + ".",
        "reviews": [{"author": _person(r), "date": _when(r, "%Y-%m-%d %H:%M:%S"),
                     "content": _text(r, r.randint(_n(8, s, 1), _n(50, s, 1))).capitalize() + ".",
                     "ratings": {k: r.randint(1, 5) for k in
                                 ("Cleanliness", "Location", "Overall", "Rooms", "Service",
                                  "Value")}}
                    for _ in range(r.choice(range(_n(4, s) + 1)))],
        "public_likes": [_person(r) for _ in range(r.randint(0, _n(6, s)))],
        "updated": _when(r, "%Y-%m-%dT%H:%M:%SZ"),
    }


def document(i: int, r: random.Random, scale: float = 1.0) -> bytes:
    """Document `i`, compact JSON. At scale 1: 40 % routes, 15 % airlines, 45 % hotels
    (~0.9 KB on average); below 1 the hotels' share shrinks (airports take it: 0.45 x
    scale of hotels) and lists and texts are `scale` times as long."""
    x = r.random()
    hotels = 0.45 * min(1.0, scale)
    kind = (_route if x < 0.4 else _airline if x < 0.55 else
            _airport if x < 1.0 - hotels else _hotel)
    doc = kind(i, r, scale)
    # what most stored documents carry besides their content: a unique identifier
    doc["uuid"] = str(uuid.UUID(int=r.getrandbits(128), version=4))
    return json.dumps(doc, separators=(",", ":")).encode()


def _mean(scale: float, sample: int = 500) -> float:
    r = random.Random(0)
    return sum(len(document(i, r, scale)) for i in range(sample)) / sample


@functools.lru_cache(maxsize=None)
def scale_for(size: int) -> float:
    """The scale whose documents are `size` bytes on average (within ~2 %; at least the
    smallest mix's ~0.2 KB), found on a sample."""
    lo, hi = 0.0, 1.0
    while _mean(hi) < size and hi < 64:
        lo, hi = hi, hi * 2
    for _ in range(10):
        mid = (lo + hi) / 2
        if _mean(mid) < size:
            lo = mid
        else:
            hi = mid
    return round(hi, 4)


def values(n: int, size: int = 900, seed: int = 42, start: int = 0):
    """Documents `start`..`start + n - 1` (bytes) of the sequence of mean size ~`size`."""
    end = start + n
    c = start // CHUNK
    while c * CHUNK < end:
        lo = c * CHUNK
        yield from _chunk(size, seed, c)[max(0, start - lo):end - lo]
        c += 1


#: seconds this process spent making documents (not those found in `_CACHE`)
made_seconds = 0.0
#: the chunks made in this process, kept: a benchmark loads the same documents into one
#: node after another (forked loaders inherit them); ~290 MB at 1M documents of 256 B
_CACHE: dict[tuple[int, int, int], list[bytes]] = {}


def _chunk(size: int, seed: int, c: int) -> list[bytes]:
    global made_seconds
    got = _CACHE.get((size, seed, c))
    if got is None:
        t = time.perf_counter()
        s = scale_for(size)
        r = random.Random(f"{seed}:{size}:{c}")
        got = _CACHE[size, seed, c] = [document(j, r, s) for j in range(c * CHUNK, (c + 1) * CHUNK)]
        made_seconds += time.perf_counter() - t
    return got


def clear() -> None:
    """Forget the documents kept (`_CACHE`)."""
    _CACHE.clear()
