"""CPU of one HTTP GET, in one thread: checkbeat's http probe against the clients it could use.

Why: the probe is the largest part of a check run's worker CPU, and the plain Celery anchor of
``precision_bench`` sends its GETs with one shared httpx client. This prints, per GET to the same
local target, the CPU (``time.thread_time``) of:

- **checkbeat http probe**: ``workers.probes.http.http_probe`` as a run calls it (resolution and
  vetting, the deadline on every socket operation, a new connection, the body read to its end);
- **httpx, shared client**: the anchor's client, keeping its connection alive between GETs;
- **http.client, new connection**: the stdlib alone, the least a new connection costs.

``python -m bench.http_client_bench [--gets 2000] [--rounds 3]``: per system the mean CPU per GET
of each round, the median, and the probe's ratio to each other system from the same rounds.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.figures import command_line
from tests.support.http_target import DelayServer
from workers.probes.http import http_probe
from workers.probes.result import ProbeContext
from workers.target_guard import AddressPolicy

TARGET = "/delay/0"


def _systems(url: str) -> list[tuple[str, Callable[[], object]]]:
    context = ProbeContext(15.0, AddressPolicy(allow_private=True))
    shared = httpx.Client(timeout=15.0)
    parts = urlsplit(url)

    def probe() -> object:
        result = http_probe(url, {}, context)
        assert result.ok, result
        return result

    def stdlib() -> object:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=15.0)
        try:
            conn.request("GET", parts.path)
            return conn.getresponse().read()
        finally:
            conn.close()

    return [
        ("checkbeat http probe", probe),
        ("httpx, shared client", lambda: shared.get(url).read()),
        ("http.client, new connection", stdlib),
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gets", type=int, default=2000, help="GETs per system and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with DelayServer() as server:
        systems = _systems(server.url(TARGET))
        rounds: dict[str, list[float]] = {name: [] for name, _ in systems}
        for r in range(args.rounds + 1):  # the first round warms up and is not counted
            for name, get in systems:
                started = time.thread_time()
                for _ in range(args.gets):
                    get()
                if r:
                    rounds[name].append(1000 * (time.thread_time() - started) / args.gets)
    print(f"one GET of {TARGET} on 127.0.0.1, {args.gets} GETs x {args.rounds} rounds, "
          "one thread (CPU ms per GET)")  # fmt: skip
    for name, values in rounds.items():
        shown = " ".join(f"{v:6.3f}" for v in values)
        print(f"{name:30}{shown:>24}  median {statistics.median(values):6.3f}")
    ours = statistics.median(rounds[systems[0][0]])
    ratios = {}
    for name, _ in systems[1:]:
        ratios[name] = ours / statistics.median(rounds[name])
        print(f"checkbeat http probe / {name:30}{ratios[name]:6.2f}x")
    return {"gets": args.gets, "cpu ms per GET": rounds, "checkbeat http probe / system": ratios}


if __name__ == "__main__":
    command_line(main)
