"""Cost of a ``body_regex`` per run: RE2 as the probe runs it against the stdlib's ``re``.

Why: the http probe matches ``body_regex`` with RE2 (``google-re2``: linear in the body and the
GIL released while it matches, so a tenant's pattern cannot stall the worker's other slots).
This prints what that costs a run on ordinary patterns and bodies, side by side with what
``re`` cost for the same search:

- **re2 (probe)**: :func:`workers.probes.bounded.regex_search`, as a run calls it (compiled
  pattern from the cache, the inline path or the deadline-bounded thread);
- **re (stdlib)**: ``re.compile(pattern).search(body)`` (the compile cached as well).

``python -m bench.regex_bench [--runs 2000] [--rounds 3]``: per pattern and body the median
microseconds per run of each engine over the rounds, and re2's ratio to re from the same rounds.
Then, for one long search per engine (RE2 on a costly pattern over 1 MiB, ``re`` backtracking
``^(a+)+$`` on 25 bytes), how long it took and the longest another thread of the process waited
to run meanwhile: whether the engine holds the GIL.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import threading
import time
from collections.abc import Callable

from bench.figures import command_line
from workers.deadline import Deadline
from workers.probes.bounded import compile_regex, regex_search

#: Ordinary patterns: what a health check asserts.
PATTERNS = {
    "literal": r"healthy",
    "json field": r'"status"\s*:\s*"(ok|up|healthy)"',
    "version": r"version \d+\.\d+\.\d+",
    "html title": r"<title>[^<]*Welcome",
    "anchored": r"^\{.*\}$",
    "case-insensitive": r"(?i)all systems operational",
}


def _bodies() -> dict[str, str]:
    health = {
        "status": "ok",
        "version": "1.24.3",
        "checks": [{"name": f"dep{i}", "status": "up", "latency_ms": i} for i in range(20)],
    }
    row = "<tr><td>service</td><td>All Systems Operational</td></tr>\n"
    page = "<html><head><title>Status - Welcome</title></head><body><table>\n"
    page += row * (64 * 1024 // len(row)) + "</table></body></html>"
    return {"1 KiB JSON": json.dumps(health), "64 KiB HTML": page}


def _engines(pattern: str, body: str) -> list[tuple[str, Callable[[], object]]]:
    compiled = re.compile(pattern)
    deadline = Deadline(3600.0)
    return [
        ("re2 (probe)", lambda: regex_search(pattern, body, deadline)),
        ("re (stdlib)", lambda: compiled.search(body)),
    ]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="searches per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"one body_regex search per run, {args.runs} runs x {args.rounds} rounds (us per run)")
    print(f"{'pattern':18}{'body':14}{'re2 (probe)':>14}{'re (stdlib)':>14}{'re2 / re':>10}")
    ratios = []
    figures: dict[str, float] = {}
    for body_name, body in _bodies().items():
        for name, pattern in PATTERNS.items():
            engines = _engines(pattern, body)
            rounds: dict[str, list[float]] = {engine: [] for engine, _ in engines}
            for r in range(args.rounds + 1):  # the first round warms up and is not counted
                for engine, search in engines:
                    started = time.perf_counter()
                    for _ in range(args.runs):
                        search()
                    if r:
                        rounds[engine].append(1e6 * (time.perf_counter() - started) / args.runs)
            ours, theirs = (statistics.median(rounds[engine]) for engine, _ in engines)
            ratios.append(ours / theirs)
            figures[f"{name} on {body_name} re2 us"] = ours
            figures[f"{name} on {body_name} re us"] = theirs
            print(f"{name:18}{body_name:14}{ours:14.2f}{theirs:14.2f}{ours / theirs:9.2f}x")
    figures["re2 / re median"] = statistics.median(ratios)
    figures["cases"] = len(ratios)
    print(f"re2 / re, median over the cases: {figures['re2 / re median']:.2f}x")
    figures.update(_gil())
    return figures


def _longest_wait(search: Callable[[], object]) -> tuple[float, float]:
    """(seconds ``search()`` took, the longest gap between two wake-ups of a thread that asks
    to run every millisecond meanwhile)."""
    stop = threading.Event()
    worst = [0.0]

    def tick() -> None:
        last = time.perf_counter()
        while not stop.wait(0.001):
            now = time.perf_counter()
            worst[0] = max(worst[0], now - last)
            last = now

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    started = time.perf_counter()
    search()
    took = time.perf_counter() - started
    stop.set()
    ticker.join()
    return took, worst[0]


def _gil() -> dict[str, float]:
    rng = random.Random(1)
    body = "".join(rng.choice("ab") for _ in range(1 << 20))
    costly = compile_regex("[ab]*a[ab]{250}c")
    backtracking = re.compile("^(a+)+$")
    cases = [
        ("re2, [ab]*a[ab]{250}c on 1 MiB", lambda: costly.search(body)),
        ("re, ^(a+)+$ on 25 bytes", lambda: backtracking.search("a" * 24 + "!")),
    ]
    print("one long search: its time, and the longest wait of another thread meanwhile (ms)")
    figures = {}
    for name, search in cases:
        took, waited = _longest_wait(search)
        figures[f"{name} took ms"] = 1000 * took
        figures[f"{name} longest wait ms"] = 1000 * waited
        print(f"{name:36}{1000 * took:10.1f}{1000 * waited:10.1f}")
    return figures


if __name__ == "__main__":
    command_line(main)
