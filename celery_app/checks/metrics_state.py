"""Scrape-time gauges of the check system, read from Redis when Prometheus asks.

Why at scrape time: depths and free slots are facts about Redis, not about one process; read
when scraped they are right on every beat (any replica may be scraped) and cost nothing between
scrapes. A few pipelined round trips: per region the ready, held and leased depth of each lane,
the registered workers and their slots, and the broker depth of each check queue. If Redis does
not answer, ``checkbeat_redis_up`` is 0 and nothing else is reported (no stale numbers).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from celery_app.checks.capacity import read_capacity
from celery_app.redis.schema import LANE_NAMES, Keys, check_queue

log = logging.getLogger(__name__)

LANES = range(len(LANE_NAMES))
REGION_LANE = ["region", "lane"]


class CheckStateCollector:
    """``collect()``: the gauges of every region of ``regions``."""

    def __init__(
        self, client: redis.Redis, broker: redis.Redis, keys: Keys, regions: Sequence[str]
    ) -> None:
        self.client = client
        self.broker = broker
        self.keys = keys
        self.regions = tuple(regions)

    def collect(self) -> Iterable[Metric]:
        redis_up = GaugeMetricFamily(
            "checkbeat_redis_up", "1 when checkbeat's Redis answered this scrape, else 0."
        )
        try:
            families = self._read()
        except redis.RedisError as exc:
            log.warning("metrics: Redis unreachable while scraping: %s", exc)
            redis_up.add_metric([], 0)
            yield redis_up
            yield from self._broker()
            return
        redis_up.add_metric([], 1)
        yield redis_up
        yield from families
        yield from self._broker()

    def _read(self) -> list[Metric]:
        k = self.keys
        due = stored = quarantined = 0
        ready: dict[tuple[str, int], int] = {(r, lane): 0 for r in self.regions for lane in LANES}
        held: dict[tuple[str, int], int] = {(r, lane): 0 for r in self.regions for lane in LANES}
        for part in k.every_partition():  # every figure is the sum over the partitions
            part_due, part_stored, part_quarantined, part_ready, part_held = self._partition(part)
            due, stored = due + part_due, stored + part_stored
            quarantined += part_quarantined
            for cell in ready:
                ready[cell] += part_ready[cell]
                held[cell] += part_held[cell]

        g_due = GaugeMetricFamily("checkbeat_checks_due", "Jobs waiting for their next tick.")
        g_due.add_metric([], due)
        g_stored = GaugeMetricFamily("checkbeat_checks_stored", "Checks defined.")
        g_stored.add_metric([], stored)
        g_quarantined = GaugeMetricFamily(
            "checkbeat_checks_quarantined",
            "Jobs set aside because their data broke a dispatch step (checks diagnose lists them).",
        )
        g_quarantined.add_metric([], quarantined)
        g_ready = GaugeMetricFamily(
            "checkbeat_checks_ready", "Due jobs waiting for a slot (WFQ order).", labels=REGION_LANE
        )
        g_held = GaugeMetricFamily(
            "checkbeat_checks_held",
            "Due jobs held back by their tenant's token bucket.",
            labels=REGION_LANE,
        )
        g_leased = GaugeMetricFamily(
            "checkbeat_checks_leased", "Claimed jobs in flight (leases).", labels=REGION_LANE
        )
        g_free = GaugeMetricFamily(
            "checkbeat_region_free_slots",
            "Slots a job of the lane may take now (slow jobs never take reserved fast slots).",
            labels=REGION_LANE,
        )
        g_slots = GaugeMetricFamily(
            "checkbeat_region_slots", "Slots of the live workers of a region.", labels=["region"]
        )
        g_workers = GaugeMetricFamily(
            "checkbeat_region_workers",
            "Live check workers registered for a region (0: its checks cannot run).",
            labels=["region"],
        )
        for region in self.regions:
            capacity = read_capacity(self.client, k, region)
            leased = (capacity.in_flight_fast, capacity.in_flight_slow)
            free = (capacity.free, capacity.free_slow)
            for lane in LANES:
                labels = [region, LANE_NAMES[lane]]
                g_ready.add_metric(labels, ready[region, lane])
                g_held.add_metric(labels, held[region, lane])
                g_leased.add_metric(labels, leased[lane])
                g_free.add_metric(labels, free[lane])
            g_slots.add_metric([region], capacity.total)
            g_workers.add_metric([region], len(capacity.workers))
        return [
            g_due,
            g_stored,
            g_quarantined,
            g_ready,
            g_held,
            g_leased,
            g_free,
            g_slots,
            g_workers,
        ]

    def _partition(
        self, k: Keys
    ) -> tuple[int, int, int, dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """(due, stored, quarantined, ready, held) of one partition, in two round trips."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(k.due())
        pipe.scard(k.checks())
        pipe.scard(k.quarantine())
        for region in self.regions:
            pipe.smembers(k.held_tenants(region))
            for lane in LANES:
                pipe.zcard(k.ready(region, lane))
        due, stored, quarantined, *rest = pipe.execute()
        held_tenants: dict[str, list[str]] = {}
        ready: dict[tuple[str, int], int] = {}
        step = 1 + len(LANES)
        for i, region in enumerate(self.regions):
            held_tenants[region] = sorted(rest[i * step])
            for lane in LANES:
                ready[region, lane] = rest[i * step + 1 + lane]
        pipe = self.client.pipeline(transaction=False)
        cells = [
            (region, lane, tenant)
            for region in self.regions
            for tenant in held_tenants[region]
            for lane in LANES
        ]
        for region, lane, tenant in cells:
            pipe.zcard(k.held(region, lane, tenant))
        held: dict[tuple[str, int], int] = {(r, lane): 0 for r in self.regions for lane in LANES}
        for (region, lane, _tenant), count in zip(cells, pipe.execute(), strict=True):
            held[region, lane] += count
        return due, stored, quarantined, ready, held

    def _broker(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "checkbeat_broker_up", "1 when the broker's Redis answered this scrape, else 0."
        )
        depth = GaugeMetricFamily(
            "checkbeat_broker_queue_messages",
            "Messages waiting in the broker queue of a lane (Celery holds only what can start).",
            labels=REGION_LANE,
        )
        cells = [(region, lane) for region in self.regions for lane in LANES]
        try:
            pipe = self.broker.pipeline(transaction=False)
            for region, lane in cells:
                pipe.llen(check_queue(region, lane))
            counts = pipe.execute()
        except redis.RedisError as exc:
            log.warning("metrics: the broker is unreachable while scraping: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for (region, lane), count in zip(cells, counts, strict=True):
            depth.add_metric([region, LANE_NAMES[lane]], count)
        yield depth
