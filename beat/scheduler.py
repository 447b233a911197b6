"""``beat.CronScheduler``: the Celery beat scheduler that runs the cron engine and the drivers.

Why a Scheduler subclass: ``celery -A celery_app beat`` (and ``worker -B``) keep working, with
Celery's Service loop calling :meth:`CronScheduler.tick` and sleeping for what it returns. Any
number of beats may run at once: the per-window keys make each singleton fire once.

The tasks are every source's (:mod:`celery_app.cron_tasks.task_sources`: ``@cron``,
``beat_schedule`` and ``add_periodic_task``, runtime schedules); a change to the runtime ones is
seen at the next tick (one GET of their version) and loaded without a restart.

A beat must not die because Redis or the broker blinked: a failed tick is logged and retried
with a growing back-off; windows missed meanwhile are fired late within their grace.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeGuard, runtime_checkable

from celery.beat import Scheduler

from beat.cron_engine import CronEngine, settle_long_lived
from beat.cron_monitor import CronMonitor
from beat.dispatch_wake import WakeListener
from beat.metrics_endpoint import BeatObserver
from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.layout import PartitionLayoutError, ensure_layout
from celery_app.cron_tasks.celery_schedules import BeatEntryError
from celery_app.cron_tasks.cron_state import CronStore
from celery_app.cron_tasks.lead import fire_lead
from celery_app.cron_tasks.registration import WINDOW, CronSpecError
from celery_app.cron_tasks.runtime import RuntimeStore
from celery_app.cron_tasks.sender import CronPublisher
from celery_app.cron_tasks.task_sources import all_tasks
from celery_app.cron_tasks.tenants_provider import resolve_tenants
from celery_app.factory import runs_checkbeat_tasks, settings_of
from celery_app.metrics import record as metrics
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.scripts import load_all
from celery_app.wall_clock import clock_from_env

log = logging.getLogger(__name__)

MAX_BACKOFF = 10.0
#: Drivers may tick every second; the heartbeat need not be written that often.
HEARTBEAT_MIN_GAP = 5.0
#: Smallest sleep: a window boundary is waited for, not spun on.
MIN_SLEEP = 0.005
#: The loop's watch for rare events (a runtime schedule changed; a dead beat's claim, whose
#: lease lasts seconds, to take over) reads Redis at most this often. Why: beat's loop also
#: wakes for the check dispatcher, as often as a job enters its lead; reading on every wake-up
#: would cost a few commands per check run at low rates.
CRON_WATCH_GAP_S = 0.25


@runtime_checkable
class Driver(Protocol):
    """Anything beat runs every ``interval`` seconds besides the cron engine (sooner when it is
    a :class:`PacedDriver`: the seconds until it wants to run again after a tick that returned
    ``report``; the check dispatcher wakes when its next due job enters its lead).

    A driver reads its own clock: the check dispatcher schedules on Redis's time, not beat's
    (which runs the cron engine and may be a test clock), so beats and workers agree.

    A :class:`WakeableDriver` (with a ``wake_channel``, a pub/sub channel name) also runs as
    soon as a message comes on it (the check store's writes: :mod:`beat.dispatch_wake`).
    """

    interval: float

    def tick(self) -> object: ...


@runtime_checkable
class PacedDriver(Driver, Protocol):
    """A driver that says when it wants to run again after a tick (the check dispatcher: when
    its next due job enters its lead), instead of every ``interval``."""

    def next_wait(self, report: Any) -> float: ...


@runtime_checkable
class WakeableDriver(Driver, Protocol):
    """A driver that also runs as soon as a message comes on its pub/sub channel."""

    wake_channel: str


def _wakeable(driver: Driver) -> TypeGuard[WakeableDriver]:
    return isinstance(driver, WakeableDriver) and bool(driver.wake_channel)


def build_drivers(app: Any) -> list[Driver]:
    """Every driver beat runs for ``app``: the check dispatcher of each partition of the check
    half (every beat dispatches every partition; their claims are atomic), and the cron
    monitor (``beat.cron_monitor``: given its tasks by setup) where the app's workers can
    deliver the transitions it makes (:func:`~celery_app.factory.runs_checkbeat_tasks`)."""
    first = Dispatcher(app)
    rest = [
        Dispatcher(app, partition=p, publisher=first.publisher)
        for p in range(1, first.keys.partitions)
    ]
    monitor = [CronMonitor(app)] if runs_checkbeat_tasks(app) else []
    return [first, *rest, *monitor]


@dataclass
class _DriverSlot:
    driver: Driver
    due: float  # monotonic
    # what the driver is, decided once: a runtime Protocol check costs a tick too much
    paced: PacedDriver | None = field(init=False)
    wakeable: bool = field(init=False)

    def __post_init__(self) -> None:
        self.paced = self.driver if isinstance(self.driver, PacedDriver) else None
        self.wakeable = _wakeable(self.driver)


@contextmanager
def finish_tick_before_stopping() -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block ends, then deliver them.

    A tick interrupted between taking window keys and publishing would lose the window; Celery's
    beat raises SystemExit from its signal handler, so the tick defers it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    wanted = (signal.SIGTERM, signal.SIGINT)
    previous: dict[int, Any] = {  # keyed by Signals, looked up by the number received
        sig: signal.signal(sig, lambda signum, _frame: received.append(signum)) for sig in wanted
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received:
            handler = previous[received[0]]
            if callable(handler):
                handler(received[0], None)
            else:
                raise SystemExit(128 + received[0])


class CronScheduler(Scheduler):
    """Fires cron tasks every window and runs the drivers at their intervals."""

    #: Upper bound of a sleep, so the heartbeat stays fresh (beat's own max_interval also applies).
    heartbeat_every = 15.0

    def __init__(
        self, app: Any, *args: Any, clock: Callable[[], datetime] | None = None, **kwargs: Any
    ) -> None:
        env_clock = clock_from_env()
        self.clock = clock or env_clock.now
        self._rate = 1.0 if clock else env_clock.rate
        # Steps are detected against the monotonic clock, unless a test drives the clock.
        self._steady: Callable[[], float] | None = None if clock else env_clock.steady
        if clock is None and env_clock.start is not None:
            # Under the test clock (tests only), schedules without a fixed grid read it too:
            # their is_due compares its now() with the last run the engine wrote by it.
            app.now = lambda: env_clock.now().astimezone(app.timezone)
        self.engine: CronEngine | None = None
        self.drivers: list[_DriverSlot] = []
        self.beat_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._backoff = 0.0
        self._last_sweep: datetime | None = None
        self._last_heartbeat = float("-inf")
        self._last_watch = float("-inf")
        self.observer: BeatObserver | None = None
        self.waker: WakeListener | None = None
        self.monitor: CronMonitor | None = None
        # A caller that drives the clock also drives the ticks: tick() must return at once.
        self._may_wait = clock is None
        kwargs.pop("schedule_filename", None)
        super().__init__(app, *args, **kwargs)

    # --- Scheduler contract -------------------------------------------------------------
    def setup_schedule(self) -> None:
        app = self.app
        app.loader.import_default_modules()
        settings = settings_of(app)
        client = get_redis(settings.redis_url, settings)
        keys = state_keys(settings)
        self.runtime = RuntimeStore(client, keys)
        self._runtime_version = self.runtime.version()
        # A duplicate id, entries that are not schedules: refuse to start, naming every one on
        # a line of its own (a traceback would name only the first).
        try:
            tasks = list(all_tasks(app, self.runtime).values())
        except (CronSpecError, BeatEntryError) as exc:
            for line in str(exc).splitlines():
                log.error("cron: %s", line)
            log.error("cron: beat not started: fix the entries above")
            raise SystemExit(2) from None
        store = CronStore(client, keys, settings.cron_grace)
        sender = CronPublisher(app, settings.cron_grace)
        sender.prepare(tasks)
        self.sender = sender
        self.store = store
        self.engine = CronEngine(
            tasks,
            store,
            sender,
            resolve_tenants(app),
            grace=settings.cron_grace,
            owner=f"beat:{self.beat_id}",
            clock=self.clock,
            steady=self._steady,
            lead=fire_lead(app, tasks),
            custom_max_wait=float(self.max_interval),  # type: ignore[arg-type]  # set by now
        )
        try:
            store.prune_heartbeats(self.clock() - timedelta(days=1))
            store.prune_pending(self.clock() - timedelta(days=1))
        except Exception as exc:
            log.warning("cron: could not prune old heartbeats and claims: %s", exc)
        try:
            ensure_layout(client, keys)
        except PartitionLayoutError as exc:
            log.error("checks: %s", exc)
            log.error("checks: beat not started")
            raise SystemExit(2) from None
        now = time.monotonic()
        drivers = build_drivers(app)
        self.monitor = next((d for d in drivers if isinstance(d, CronMonitor)), None)
        if self.monitor is not None:
            self.monitor.set_tasks(tasks)
        self.drivers = [_DriverSlot(d, now) for d in drivers]
        channels = [s.driver.wake_channel for s in self.drivers if _wakeable(s.driver)]
        self.waker = WakeListener(client, channels) if channels and self._may_wait else None
        load_all(client)  # no first call re-run after a NOSCRIPT (see load_all)
        log.info("cron: %d tasks, %d drivers, beat %s", len(tasks), len(self.drivers), self.beat_id)
        self.observer = self.observer or BeatObserver(app, self.beat_id, [t.id for t in tasks])
        settle_long_lived()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Run what is due; return the seconds to sleep (Celery's Service sleeps that long).
        With wake channels the sleep is taken here, cut short by a message (see
        :meth:`_wait`), and 0 is returned: Celery's loop ticks again at once."""
        with finish_tick_before_stopping():
            started = time.perf_counter()
            sleep = self._tick()
            sleep = self.observer.ticked(started, sleep) if self.observer else sleep
        return self._wait(sleep)

    def _wait(self, sleep: float) -> float:
        """Wait ``sleep`` on the drivers' wake channels; a message makes those drivers due."""
        if self.waker is None or sleep <= MIN_SLEEP:
            return sleep
        if self.waker.wait(sleep):
            now = time.monotonic()
            for slot in self.drivers:
                if slot.wakeable:
                    slot.due = now
        return 0.0

    def sync(self) -> None:
        """Nothing to persist: the state lives in Redis as it happens."""

    def close(self) -> None:
        if self.observer is not None:
            self.observer.stop()
        if self.waker is not None:
            self.waker.close()
        store = getattr(self, "store", None)
        if store is None:
            return  # never set up: no heartbeat was written
        try:
            store.beat_stopped(self.beat_id, self.clock())
        except Exception:
            log.warning("cron: could not remove the heartbeat of %s", self.beat_id)

    @property
    def info(self) -> str:
        """Beat's start banner. Celery prints it before the schedule is set up, so the tasks
        are counted here as setup will load them (the same sources)."""
        count: int | str = len(self.engine.tasks) if self.engine is not None else "?"
        drivers: int | str = len(self.drivers) if self.engine is not None else "?"
        if self.engine is None:
            try:
                self.app.loader.import_default_modules()
                settings = settings_of(self.app)
                client = get_redis(settings.redis_url, settings)
                count = len(all_tasks(self.app, RuntimeStore(client, state_keys(settings))))
                drivers = len(build_drivers(self.app))
            except Exception:
                pass  # setup_schedule reports the problem, naming it
        return f"    . cron tasks -> {count}\n    . drivers -> {drivers}"

    @property
    def schedule(self) -> dict[str, Any]:  # type: ignore[override]  # an attribute in celery-types
        return {}

    # --- the loop body ------------------------------------------------------------------
    def _tick(self) -> float:
        assert self.engine is not None
        now = self.clock()
        watch = self._watch_due()
        try:
            if watch:
                self._reload_if_changed(now)
            # The engine reads its clocks itself: ``now`` may be older than a blocked call.
            report = self.engine.tick()
            metrics.cron_tick(report)
            mono = time.monotonic()
            if mono - self._last_heartbeat >= HEARTBEAT_MIN_GAP:
                self.store.heartbeat(self.beat_id, now)
                self._last_heartbeat = mono
        except Exception as exc:
            metrics.beat_tick_failed()
            self._backoff = min(MAX_BACKOFF, max(0.5, self._backoff * 2))
            log.warning("cron: tick failed (%s); retrying in %.1fs", exc, self._backoff)
            return self._backoff
        self._backoff = 0.0
        if watch:
            self._take_over(now)
        self._sweep(now)
        if report.fired or report.skipped:
            log.info(
                "cron: fired %d, skipped %d at %s", len(report.fired), len(report.skipped), now
            )
        for slot in self.drivers:
            started = time.monotonic()
            if started >= slot.due:
                wait = slot.driver.interval
                try:
                    driven = slot.driver.tick()
                    if slot.paced is not None:
                        wait = slot.paced.next_wait(driven)
                except Exception:
                    log.exception(
                        "beat: driver %r failed; it runs again next interval", slot.driver
                    )
                # The wait counts from the tick's own start (the dispatcher's is from the
                # Redis time it read first): counted from its end, every wake-up came the
                # tick's duration late, and work due within the lead was claimed that late.
                slot.due = started + wait
        return self._sleep_for(self.clock())

    def _watch_due(self) -> bool:
        """Whether this pass reloads changed runtime schedules and takes over claims: at most
        every :data:`CRON_WATCH_GAP_S`, and on every pass when a caller drives the clock (it
        drives the passes too, and counts on each)."""
        if not self._may_wait:
            return True
        mono = time.monotonic()
        if mono - self._last_watch < CRON_WATCH_GAP_S:
            return False
        self._last_watch = mono
        return True

    def _take_over(self, now: datetime) -> None:
        """At most every CRON_WATCH_GAP_S (one ZRANGEBYSCORE): publish claims whose claimer
        never confirmed them."""
        assert self.engine is not None
        try:
            taken = self.engine.take_over(now)
        except Exception as exc:
            log.warning("cron: could not take over unconfirmed claims: %s", exc)
            return
        metrics.cron_takeover(taken)
        if taken.published or taken.lost:
            log.warning(
                "cron: took over %d unconfirmed windows, %d lost",
                len(taken.published),
                len(taken.lost),
            )

    def _reload_if_changed(self, now: datetime) -> None:
        """One GET, at most every CRON_WATCH_GAP_S: when the runtime schedules' version moved,
        reload the task list (unchanged tasks keep their place). A list that no longer merges
        (a runtime id now declared in code) is logged and the running list kept: a beat must
        not stop."""
        assert self.engine is not None
        version = self.runtime.version()
        if version == self._runtime_version:
            return
        try:
            tasks = list(all_tasks(self.app, self.runtime).values())
        except CronSpecError as exc:
            log.error("cron: runtime schedules not reloaded: %s", exc)
            self._runtime_version = version
            return
        self.sender.prepare(tasks)
        self.engine.set_tasks(tasks, now)
        if self.monitor is not None:
            self.monitor.set_tasks(tasks)
        self.engine.lead = fire_lead(self.app, tasks)
        self._runtime_version = version
        settle_long_lived()
        log.info("cron: runtime schedules changed (version %s): %d tasks", version, len(tasks))

    def _sweep(self, now: datetime) -> None:
        """Once a minute: claims a dead beat never published become gap records."""
        if self._last_sweep is not None and now - self._last_sweep < timedelta(minutes=1):
            return
        self._last_sweep = now
        try:
            cutoff = now - WINDOW - self.store.grace
            lost = self.store.sweep_lost_claims(cutoff, now)
            if lost:
                log.error("cron: %d claimed windows were never published: %s", len(lost), lost[:5])
        except Exception as exc:
            log.warning("cron: could not sweep unconfirmed claims: %s", exc)

    def _sleep_for(self, now: datetime) -> float:
        # Scheduler.__init__ falls back to beat_max_loop_interval, then its default: never None
        waits = [float(self.max_interval), self.heartbeat_every]  # type: ignore[arg-type]  # see above
        next_due = self.engine.next_fire() if self.engine else None
        if self.engine is not None:
            now = self.engine.trusted(now)  # a held clock step must not make beat spin
        if next_due is not None:
            waits.append((next_due - now).total_seconds() / self._rate)
        mono = time.monotonic()
        waits.extend(slot.due - mono for slot in self.drivers)
        return max(MIN_SLEEP, min(waits))
