"""What must never reach a dcptool command's terminal: Spark's and the JVM's own output.

`assert_no_noise(out, err)` fails on a Python traceback, a Java stack frame, a py4j line or a
line of Spark's own (its start-up and shutdown lines, log4j lines).
"""
from __future__ import annotations

import re

NOISE = [
    re.compile(r"Traceback \(most recent call last\)"),
    re.compile(r"^\s+at (org|java|scala|jdk|sun|py4j)\.", re.M),  # a Java stack frame
    re.compile(r"py4j", re.I),
    re.compile(r"WARNING: Using incubator modules"),
    re.compile(r"Setting default log level"),
    re.compile(r"To adjust logging level"),
    re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) "),  # log4j
    re.compile(r"org\.apache\.spark|SparkContext|daemon\.py|pyspark", re.I),
]


def assert_no_noise(*texts: str) -> None:
    for text in texts:
        for pat in NOISE:
            m = pat.search(text)
            assert m is None, f"{pat.pattern!r} matched in:\n{text}"
