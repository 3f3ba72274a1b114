"""Documents for the Snappy tests: varied JSON like real data, written to a node through a
connection that negotiated Snappy (values sent compressed, datatype JSON|SNAPPY)."""
from __future__ import annotations

import dataclasses
import json
import random

from client.nodeutil import send_sets
from dcptool.protocol import Set, vbucket_of
from dcptool.protocol.snappy import compress

_WORDS = ("the quiet room near the station had a view of the old harbour and breakfast was "
          "served on the terrace every morning staff were friendly and the price fair for "
          "the location although parking was hard to find late at night").split()
_CITIES = ["Paris", "London", "Lyon", "Nice", "Manchester", "San Francisco", "Los Angeles"]


def document(i: int, r: random.Random) -> dict:
    """One of three shapes (route, hotel, airline) with nested objects, arrays and text."""
    kind = ("route", "hotel", "airline")[i % 3]
    if kind == "route":
        return {"type": kind, "id": i, "airline": r.choice(["AF", "BA", "KL"]),
                "from": r.choice(["CDG", "LHR", "SFO"]), "to": r.choice(["NCE", "MAN", "LAX"]),
                "distance": round(r.uniform(200, 9000), 3),
                "schedule": [{"day": r.randint(0, 6), "utc": f"{r.randint(0, 23):02d}:"
                              f"{r.randint(0, 59):02d}:00", "flight": f"AF{r.randint(1, 999)}"}
                             for _ in range(r.randint(3, 12))]}
    if kind == "hotel":
        return {"type": kind, "id": i, "name": f"Hotel {r.choice(_WORDS).title()} {i}",
                "city": r.choice(_CITIES), "price": round(r.uniform(40, 400), 2),
                "geo": {"lat": round(r.uniform(-60, 60), 5), "lon": round(r.uniform(-180, 180), 5)},
                "free_breakfast": r.random() < 0.5, "tags": r.sample(_WORDS, 3),
                "reviews": [{"author": f"guest{r.randint(1, 500)}", "rating": r.randint(1, 5),
                             "content": " ".join(r.choices(_WORDS, k=r.randint(8, 30)))}
                            for _ in range(r.randint(1, 3))]}
    return {"type": kind, "id": i, "name": f"{r.choice(_WORDS).title()} Air",
            "callsign": r.choice(_WORDS).upper(), "country": r.choice(["France", "United Kingdom"]),
            "fleet": [{"model": r.choice(["A320", "B738", "E190"]), "count": r.randint(1, 40)}
                      for _ in range(r.randint(2, 5))]}


def documents(n: int, prefix: str, seed: int = 7) -> dict[bytes, bytes]:
    r = random.Random(seed)
    return {f"{prefix}{i:04d}".encode(): json.dumps(document(i, r)).encode() for i in range(n)}


def write_compressed(opts, docs: dict[bytes, bytes], vbuckets: int, *, flags: int = 0,
                     expiry: int = 0, datatype: int = 0x01) -> None:
    """SET each document snappy-compressed (datatype `datatype`|SNAPPY) over a connection
    that negotiated Snappy; the node stores it decompressed."""
    with dataclasses.replace(opts, snappy=True).connect() as conn:
        assert 0x0A in conn.features, "the node did not negotiate Snappy"
        send_sets(conn, ((key, Set(key=key, value=compress(value),
                                   vbucket=vbucket_of(key, vbuckets), flags=flags,
                                   expiry=expiry, datatype=datatype | 0x02))
                         for key, value in docs.items()))
