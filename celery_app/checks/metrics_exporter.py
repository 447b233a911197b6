"""The per-check exporter: blackbox-style series for one page of checks, read from Redis.

Why capped and paged: a label per check is the one unbounded label checkbeat exports, so one
scrape reads at most ``CHECKBEAT_METRICS_CHECKS_PAGE_SIZE`` checks (default 1,000): page ``N``
of the check uids in sorted order, then two pipelined round trips
(each check's regions and last results, then its jobs). More checks: scrape more pages (one
Prometheus job per page with ``params: {page: [N]}``) or raise the page size (docs/metrics.md).
Each page also says how many checks and pages there are, so a missing page is visible
(``checkbeat_probe_exporter_pages``).

The sorted uid list is not read per scrape (for 100,000 checks that read is most of the cost):
beat's refresher thread reads it every :data:`UIDS_CACHE_S` and soon after a scrape sees the
number of checks change, so a new check is on its page a scrape later.

Series per (check, region): ``checkbeat_probe_success`` (1 when the last result was up),
``checkbeat_probe_duration_seconds`` (its latency), ``checkbeat_probe_cost_ewma_seconds``,
``checkbeat_probe_lane`` (1, the lane in a label), ``checkbeat_probe_last_run_timestamp_seconds``
and ``checkbeat_probe_ssl_earliest_cert_expiry`` when the probe recorded a certificate's end
(``detail.cert_not_after``: ISO 8601 as the http probe records it, or Unix seconds).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from celery_app.checks.store import listed_uids
from celery_app.redis.schema import LANE_NAMES, CheckField, JobField, Keys, job_id

log = logging.getLogger(__name__)

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
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def invalidate(self) -> None:
        """Read the uid list again at the next page (benchmarks measure that cold path)."""
        with self._lock:
            self._read_at = float("-inf")

    def reload(self) -> None:
        """Read and sort every check uid (SMEMBERS: the cost grows with the checks stored)."""
        uids = listed_uids(self.client, self.keys)
        with self._lock:
            self._uids, self._read_at = uids, time.monotonic()

    def start_refresh(self) -> CheckExporter:
        """Keep the uid list fresh from a daemon thread, so no scrape waits for it: every
        ``cache_s``, and soon after a scrape saw the number of checks change."""
        try:
            self.reload()
        except redis.RedisError as exc:  # the first scrape reads it (beat must start anyway)
            log.warning("metrics: could not read the check uids: %s", exc)

        def run() -> None:
            while not self._stop.is_set():
                self._wake.wait(self.cache_s)
                self._wake.clear()
                if self._stop.is_set():
                    return
                try:
                    self.reload()
                except redis.RedisError as exc:
                    log.warning("metrics: could not read the check uids: %s", exc)

        self._refresher = threading.Thread(target=run, name="checkbeat-uids", daemon=True)
        self._refresher.start()
        return self

    def stop_refresh(self) -> None:
        self._stop.set()
        self._wake.set()

    def _sorted_uids(self) -> list[str]:
        """Every check uid, sorted. Without the refresher (tests, the bench) it is read here
        when the count changed or the copy is older than ``cache_s``; with it, a change only
        wakes the refresher and this scrape uses the copy it has."""
        pipe = self.client.pipeline(transaction=False)
        for part in self.keys.every_partition():
            pipe.scard(part.checks())
        count = sum(pipe.execute())
        with self._lock:
            uids, read_at = self._uids, self._read_at
        if count == len(uids) and time.monotonic() - read_at < self.cache_s:
            return uids
        if self._refresher is not None and self._refresher.is_alive():
            self._wake.set()
            return uids
        self.reload()
        with self._lock:
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
        families: list[Metric] = []
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
            stamp = float(expiry) if isinstance(expiry, int | float) else _timestamp(expiry)
            if stamp is not None:
                cert.add_metric(labels, stamp)
        return [success, duration, cost, lane, finished, cert]
