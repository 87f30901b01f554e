"""Writes tests/slow.txt from a JUnit XML report of a run of the tests not marked slow:

    python -m pytest -m "not slow" --junitxml=/tmp/fast.xml
    python tests/slow_list.py /tmp/fast.xml >> tests/slow.txt   # review, then keep the file sorted

A test is listed (marked slow by tests/conftest.py) when it took more than THRESHOLD seconds,
unless every case of its function did and it is the fastest of them, at most ONLY_COVER
seconds: then it stays in `make test-fast` as the cover of that function's behaviour. Whole
files of process-level tests (subprocesses, servers, the tuner end to end) carry
``pytestmark = pytest.mark.slow`` instead and are not listed here.
"""
from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET

THRESHOLD = 0.4
ONLY_COVER = 1.5


def slow_cases(junit_path: str):
    cases = []
    for tc in ET.parse(junit_path).getroot().iter("testcase"):
        if tc.find("skipped") is not None:
            continue
        node = tc.get("classname").replace(".", "/") + ".py::" + tc.get("name")
        cases.append((float(tc.get("time")), node))
    by_function = collections.defaultdict(list)
    for c in cases:
        by_function[c[1].split("[")[0]].append(c)
    out = []
    for cs in by_function.values():
        over = [c for c in cs if c[0] > THRESHOLD]
        if len(over) == len(cs):
            fastest = min(cs)
            if fastest[0] <= ONLY_COVER:
                over.remove(fastest)
        out += over
    return sorted(out, key=lambda c: c[1])


if __name__ == "__main__":
    for seconds, node in slow_cases(sys.argv[1]):
        print(f"{seconds:.1f}\t{node}")
