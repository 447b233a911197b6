"""Worker roles (the lanes) and the capacity registration the dispatcher reads.

Why lanes are worker processes: Celery cannot cap one queue inside one worker, so the fast lane's
reserved slots are a worker of their own. The *fast* role consumes only ``checks.<region>.fast``
with ``fast_lane_reserved`` slots; the *shared* role consumes both lanes with the rest of the
pool. Fast work may take any slot, slow work never takes a reserved one.

The dispatcher never fills the broker beyond free capacity, so it must know the capacity: every
check worker keeps a hash (region, role, queues, concurrency) alive with a heartbeat and removes
it on warm shutdown. A killed worker's hash expires after ``WORKER_TTL_S``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from celery_app.checks.layout import PartitionLayoutError, ensure_layout
from celery_app.errors import CheckbeatError
from celery_app.redis.schema import LANE_NAMES, Keys, WorkerField, WorkerRoleName, check_queue
from celery_app.settings import Settings
from scheduling_core.partitions import slot_shares, take_from_shares

log = logging.getLogger(__name__)

ROLES = tuple(WorkerRoleName)
#: A worker's registration lives this long without a heartbeat.
WORKER_TTL_S = 15
#: How often a live worker refreshes its registration.
HEARTBEAT_S = 5.0


class RoleError(CheckbeatError, ValueError):
    """A worker role cannot be set up as asked; the message says what is allowed."""


@dataclass(frozen=True)
class WorkerRole:
    """What a check worker consumes and with how many slots."""

    role: str
    region: str
    queues: tuple[str, ...]
    concurrency: int

    def fields(self, hostname: str) -> dict[str, str]:
        """The worker hash (every value a string, as Redis stores it)."""
        return {
            WorkerField.HOSTNAME: hostname,
            WorkerField.REGION: self.region,
            WorkerField.ROLE: self.role,
            WorkerField.QUEUES: ",".join(self.queues),
            WorkerField.CONCURRENCY: str(self.concurrency),
            WorkerField.PID: str(os.getpid()),
        }


def plan_role(role: str, region: str | None, settings: Settings) -> WorkerRole:
    """The queues and concurrency of ``--role`` in ``--region`` (default: the default region)."""
    if role not in ROLES:
        raise RoleError(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    region = region or settings.default_region
    if region not in settings.regions:
        raise RoleError(
            f"--region {region!r} is not in CHECKBEAT_REGIONS ({', '.join(settings.regions)})"
        )
    if role == "fast":
        if settings.fast_lane_reserved < 1:
            raise RoleError(
                "--role fast needs CHECKBEAT_FAST_LANE_RESERVED >= 1 (it is 0): "
                "run only the shared role"
            )
        return WorkerRole(
            "fast", region, (check_queue(region, "fast"),), settings.fast_lane_reserved
        )
    return WorkerRole(
        "shared",
        region,
        (check_queue(region, "fast"), check_queue(region, "slow")),
        settings.shared_slots,
    )


def parse_check_queue(queue: str) -> tuple[str, str] | None:
    """``checks.<region>.<lane>`` -> (region, lane), or None for any other queue."""
    parts = queue.split(".")
    if len(parts) == 3 and parts[0] == "checks" and parts[2] in LANE_NAMES and parts[1]:
        return parts[1], parts[2]
    return None


def role_from_queues(queues: Iterable[str], concurrency: int) -> WorkerRole | None:
    """The role of a worker started with plain ``-Q``/``-c``; None if it runs no check queue.

    A worker consuming a slow queue is ``shared`` (its slots are the ones slow work may take);
    one consuming only fast queues is ``fast``. Check queues of more than one region are refused:
    a slot would be counted in every region.
    """
    lanes: dict[str, set[str]] = {}
    check_queues = []
    for queue in queues:
        parsed = parse_check_queue(queue)
        if parsed:
            lanes.setdefault(parsed[0], set()).add(parsed[1])
            check_queues.append(queue)
    if not lanes:
        return None
    if len(lanes) > 1:
        raise RoleError(
            f"a worker may consume the check queues of one region only, got {sorted(lanes)}; "
            "start one worker per region"
        )
    (region, region_lanes), *_ = lanes.items()
    role = "shared" if "slow" in region_lanes else "fast"
    return WorkerRole(role, region, tuple(sorted(check_queues)), concurrency)


#: The registrations this process keeps alive: hostname -> (the pid that started it, it). A
#: forked child inherits the dict, not the registration's thread: the pid tells them apart.
_KEPT_HERE: dict[str, tuple[int, CapacityRegistration]] = {}


def slots_known_live(hostname: str) -> bool | None:
    """Whether ``hostname``'s slots are live (registered, no probe holding one past its
    deadline) as this process knows it, when this process keeps its registration (a threads
    or solo pool); None when it does not (a prefork pool's child: its parent registers), and
    the worker's hash must be read. A completion asks this instead of reading the hash."""
    kept = _KEPT_HERE.get(hostname)
    if kept is None or kept[0] != os.getpid():
        return None
    return kept[1].stuck() == 0


class CapacityRegistration:
    """Keeps one worker's hash alive in Redis from a daemon thread (start/stop)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        hostname: str,
        role: WorkerRole,
        interval_s: float = HEARTBEAT_S,
        ttl_s: int = WORKER_TTL_S,
        stuck: Callable[[], int] = lambda: 0,
    ) -> None:
        self.stuck = stuck  # slots held by probe threads running past their deadline
        self.client = client
        self.keys = keys
        self.hostname = hostname
        self.role = role
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Write the hash, its TTL and the region membership, in each partition of the check
        half with that partition's share of the slots (``scheduling_core.partitions``), in one
        round trip per partition."""
        parts = self.keys.every_partition()
        offset = zlib.crc32(self.hostname.encode()) % len(parts)
        shares = slot_shares(self.role.concurrency, len(parts), offset)
        stuck = take_from_shares(shares, self.stuck())
        fields = self.role.fields(self.hostname)
        fields[WorkerField.HEARTBEAT] = f"{time.time()}"
        for part, share, busy in zip(parts, shares, stuck, strict=True):
            key = part.worker(self.hostname)
            fields[WorkerField.CONCURRENCY] = str(share)
            fields[WorkerField.STUCK] = str(busy)
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]  # str keys (Mapping is invariant)
            pipe.expire(key, self.ttl_s)
            pipe.sadd(part.region_workers(self.role.region), self.hostname)
            pipe.execute()

    def report_stuck(self, _count: int = 0) -> None:
        """Beat now: the stuck-slot count changed (not after a stop: never re-register)."""
        if self._thread is not None and not self._stop.is_set():
            self.beat()

    def unregister(self) -> None:
        for part in self.keys.every_partition():
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(part.worker(self.hostname))
            pipe.srem(part.region_workers(self.role.region), self.hostname)
            pipe.execute()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except redis.RedisError as exc:  # keep beating: Redis may come back
                log.warning("checkbeat: capacity heartbeat of %s failed: %s", self.hostname, exc)

    def start(self) -> None:
        try:
            ensure_layout(self.client, self.keys)
        except PartitionLayoutError as exc:  # its slots would serve partitions nobody fills
            log.error("checkbeat: %s: %s not registered, it runs no check", exc, self.hostname)
            return
        partitions = self.keys.partitions
        if self.role.concurrency < partitions:
            log.warning(
                "checkbeat: %s has %d slot(s) for %d partitions of the check half "
                "(CHECKBEAT_CHECK_PARTITIONS): it serves only %d of them; give it at least %d",
                self.hostname, self.role.concurrency, partitions, self.role.concurrency,
                partitions,
            )  # fmt: skip
        self.beat()
        _KEPT_HERE[self.hostname] = (os.getpid(), self)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="checkbeat-capacity", daemon=True)
        self._thread.start()
        log.info(
            "checkbeat: %s registered as %s worker of region %s: %s x%d",
            self.hostname,
            self.role.role,
            self.role.region,
            ",".join(self.role.queues),
            self.role.concurrency,
        )

    def stop(self) -> None:
        if _KEPT_HERE.get(self.hostname, (0, None))[1] is self:
            del _KEPT_HERE[self.hostname]  # first: no slot is handed off past this point
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 1)
            self._thread = None
        try:
            self.unregister()
        except redis.RedisError as exc:
            log.warning("checkbeat: could not unregister %s: %s", self.hostname, exc)
