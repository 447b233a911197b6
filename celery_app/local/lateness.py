"""Start lateness p50/p99 per lane for the live view, from the workers' own histograms.

Why from the histograms: it is the same data Prometheus and the dashboard use
(``checkbeat_check_start_lateness_seconds``), summed over every worker that serves it, with the
quantile estimated the way PromQL's ``histogram_quantile`` does (linear inside a bucket).
:class:`LatenessWindow` keeps earlier readings so the view shows the last minute, not the
totals since the workers started.
"""

from __future__ import annotations

import math
import time
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAM = "checkbeat_check_start_lateness_seconds"
#: (region, lane) -> {upper bound: cumulative count}
Buckets = dict[tuple[str, str], dict[float, float]]


def scrape(urls: Iterable[str], timeout: float = 1.0, authorization: str | None = None) -> Buckets:
    """The summed lateness buckets of every ``/metrics`` URL that answers; ``authorization`` is
    sent when the metrics servers require credentials (CHECKBEAT_METRICS_*)."""
    total: Buckets = {}
    headers = {} if authorization is None else {"Authorization": authorization}
    for url in urls:
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                text = reply.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            if family.name != HISTOGRAM:
                continue
            for sample in family.samples:
                if sample.name != f"{HISTOGRAM}_bucket":
                    continue
                cell = (sample.labels.get("region", ""), sample.labels.get("lane", ""))
                le = float(sample.labels["le"])
                buckets = total.setdefault(cell, {})
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return total


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """``histogram_quantile(q, ...)`` of cumulative ``buckets``; None without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def difference(new: Buckets, old: Buckets) -> Buckets:
    return {
        cell: {le: count - old.get(cell, {}).get(le, 0.0) for le, count in buckets.items()}
        for cell, buckets in new.items()
    }


class LatenessWindow:
    """Readings of the last ``window_s`` seconds; :meth:`read` gives p50/p99 over them."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._readings: deque[tuple[float, Buckets]] = deque()

    def read(
        self, urls: Iterable[str], now: float | None = None, authorization: str | None = None
    ) -> dict[str, dict]:
        now = time.monotonic() if now is None else now
        current = scrape(urls, authorization=authorization)
        self._readings.append((now, current))
        while len(self._readings) > 1 and now - self._readings[1][0] >= self.window_s:
            self._readings.popleft()
        oldest = self._readings[0][1] if len(self._readings) > 1 else {}
        return summary(difference(current, oldest))


def summary(buckets: Buckets) -> dict[str, dict]:
    """``"region/lane"`` -> {p50, p99, runs} (seconds; None without runs)."""
    out = {}
    for (region, lane), cell in sorted(buckets.items()):
        runs = max(cell.values()) if cell else 0.0
        out[f"{region}/{lane}"] = {
            "p50": quantile(0.5, cell),
            "p99": quantile(0.99, cell),
            "runs": int(runs),
        }
    return out
