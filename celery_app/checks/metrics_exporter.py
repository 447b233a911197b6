"""The per-check exporter: blackbox-style series for one page of checks, read from Redis.

Why capped and paged: a label per check is the one unbounded label checkbeat exports, so one
scrape reads at most ``CHECKBEAT_METRICS_CHECKS_PAGE_SIZE`` checks (default 1,000): page ``N``
of the check uids in sorted order (the sorted list is kept up to :data:`UIDS_CACHE_S` while the
number of checks does not change: a delete and a create in that time show by its end), then
two pipelined round trips
(each check's regions and last results, then its jobs). More checks: scrape more pages (one
Prometheus job per page with ``params: {page: [N]}``) or raise the page size (docs/metrics.md).
Each page also says how many checks and pages there are, so a missing page is visible
(``checkbeat_probe_exporter_pages``).

Series per (check, region): ``checkbeat_probe_success`` (1 when the last result was up),
``checkbeat_probe_duration_seconds`` (its latency), ``checkbeat_probe_cost_ewma_seconds``,
``checkbeat_probe_lane`` (1, the lane in a label), ``checkbeat_probe_last_run_timestamp_seconds``
and ``checkbeat_probe_ssl_earliest_cert_expiry`` when the probe recorded a certificate's end
(``detail.cert_not_after``, Unix seconds).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from celery_app.redis.schema import LANE_NAMES, CheckField, JobField, Keys, job_id

LABELS = ["check", "tenant", "region"]
#: How long the sorted uid list is reused while the number of checks is unchanged.
UIDS_CACHE_S = 30.0
CERT_FIELD = "cert_not_after"


@dataclass(frozen=True)
class _Row:
    uid: str
    region: str


def _timestamp(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class CheckExporter:
    """``page(n)``: the metric families of page ``n`` (0-based) of ``page_size`` checks."""

    def __init__(
        self, client: redis.Redis, keys: Keys, page_size: int, cache_s: float = UIDS_CACHE_S
    ) -> None:
        self.client = client
        self.keys = keys
        self.page_size = page_size
        self.cache_s = cache_s
        self._uids: list[str] = []
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def invalidate(self) -> None:
        """Read the uid list again at the next page (benchmarks measure that cold path)."""
        with self._lock:
            self._read_at = float("-inf")

    def _sorted_uids(self) -> list[str]:
        """Every check uid, sorted; read again when the count changed or the copy is older
        than ``cache_s`` (sorting 100,000 uids on every scrape would be most of its cost)."""
        with self._lock:
            count = self.client.scard(self.keys.checks())
            now = time.monotonic()
            if count != len(self._uids) or now - self._read_at >= self.cache_s:
                self._uids = sorted(self.client.smembers(self.keys.checks()))
                self._read_at = now
            return self._uids

    def pages(self, stored: int) -> int:
        return max(1, math.ceil(stored / self.page_size))

    def page(self, number: int) -> list[Metric]:
        k = self.keys
        ordered = self._sorted_uids()
        stored = len(ordered)
        uids = ordered[number * self.page_size : (number + 1) * self.page_size]
        pipe = self.client.pipeline(transaction=False)
        for uid in uids:
            pipe.hget(k.check(uid), CheckField.REGIONS)
            pipe.hgetall(k.last_result(uid))
        replies = pipe.execute()
        rows = [
            _Row(uid, region)
            for i, uid in enumerate(uids)
            for region in (replies[2 * i] or "").split(",")
            if region
        ]
        # Only the job fields exported: parsing whole job hashes would cost the most.
        pipe = self.client.pipeline(transaction=False)
        for row in rows:
            pipe.hmget(
                k.job(job_id(row.uid, row.region)),
                JobField.TENANT,
                JobField.COST_EWMA_MS,
                JobField.LANE,
            )
        jobs = pipe.execute()
        last = {uid: replies[2 * i + 1] for i, uid in enumerate(uids)}
        families = self._meta(stored, number, len(uids))
        families.extend(self._checks(rows, jobs, last))
        return families

    def _meta(self, stored: int, number: int, count: int) -> list[Metric]:
        rows = (
            ("checkbeat_probe_exporter_checks_stored", "Checks stored (all pages).", stored),
            (
                "checkbeat_probe_exporter_pages",
                "Pages of checks at this page size.",
                self.pages(stored),
            ),
            ("checkbeat_probe_exporter_page", "The page this scrape read (0-based).", number),
            ("checkbeat_probe_exporter_page_checks", "Checks on this page.", count),
            ("checkbeat_probe_exporter_page_size", "Checks per page (the cap).", self.page_size),
        )
        families = []
        for name, help_text, value in rows:
            family = GaugeMetricFamily(name, help_text)
            family.add_metric([], value)
            families.append(family)
        return families

    def _checks(
        self,
        rows: Sequence[_Row],
        jobs: Sequence[Sequence[str | None]],
        last: dict[str, dict[str, str]],
    ) -> list[Metric]:
        success = GaugeMetricFamily(
            "checkbeat_probe_success", "1 when the check's last result was up.", labels=LABELS
        )
        duration = GaugeMetricFamily(
            "checkbeat_probe_duration_seconds",
            "Latency of the check's last probe.",
            labels=LABELS,
        )
        cost = GaugeMetricFamily(
            "checkbeat_probe_cost_ewma_seconds",
            "Smoothed probe cost (decides the lane and the time limit).",
            labels=LABELS,
        )
        lane = GaugeMetricFamily(
            "checkbeat_probe_lane", "1 for the lane the check runs in.", labels=[*LABELS, "lane"]
        )
        finished = GaugeMetricFamily(
            "checkbeat_probe_last_run_timestamp_seconds",
            "Unix time the check's last run finished.",
            labels=LABELS,
        )
        cert = GaugeMetricFamily(
            "checkbeat_probe_ssl_earliest_cert_expiry",
            "Unix time the earliest certificate of the last probe expires (when recorded).",
            labels=LABELS,
        )
        for row, (tenant, cost_ms, lane_number) in zip(rows, jobs, strict=True):
            if tenant is None:
                continue  # the job is gone (a delete raced this read)
            labels = [row.uid, tenant, row.region]
            cost.add_metric(labels, float(cost_ms or 0.0) / 1000.0)
            lane.add_metric([*labels, LANE_NAMES[int(lane_number or 0)]], 1)
            raw = last.get(row.uid, {}).get(row.region)
            if not raw:
                continue
            try:
                result = json.loads(raw)
            except ValueError:
                continue
            success.add_metric(labels, 1 if result.get("status") == "up" else 0)
            if isinstance(result.get("latency_ms"), int | float):
                duration.add_metric(labels, result["latency_ms"] / 1000.0)
            ended = _timestamp(result.get("finished_at"))
            if ended is not None:
                finished.add_metric(labels, ended)
            expiry = (result.get("detail") or {}).get(CERT_FIELD)
            if isinstance(expiry, int | float):
                cert.add_metric(labels, float(expiry))
        return [success, duration, cost, lane, finished, cert]
