"""The check job lifecycle as a stateful model-based test against a real Redis.

Random sequences of store writes (create, update of tenant / regions / period / weight /
target, disable, enable, delete), rate limits on and off, dispatcher ticks (some whose publish
fails), worker completions (on time, on time followed by the worker's refill of the freed slot
through ``refill_after_run``, on time planned from the start read and handing the freed slot to
the region's next ready job in the same call (``completion.complete_as_read``, its slot's
liveness known to the worker, or not, or read from its hash), late, after the lease was
reaped), runs abandoned before their
probe (``checks.abandon``: live, or after their lease was reaped), reaps, reconciles and a loss
of every job and index key followed by a reconcile. After every step the invariants are
read straight from Redis:

- placement: each job of an enabled check is in exactly one of due, ready (either lane), held
  (any tenant, either lane) or leases (either lane); a job of a disabled check is in none of
  due / ready / held (its lease, if claimed before the disable, runs out); a deleted check's
  (or a removed region's) job has no hash and is in no index;
- one lease: a job hash holds a lease token iff the job is in exactly one lease index, and the
  model never sees a job claimed while an earlier claim of it still holds a live lease;
- never claimed: no tick or refill claims a job of a disabled or deleted check (or of a removed
  region), nor one whose earlier claim is still live;
- completions: a worker's completion is accepted iff its token still holds the job; one whose
  lease was reaped (or whose job was deleted or lost) is refused;
- reconcile on a consistent state places nothing and restores no lease;
- every tick and refill returns without raising, except a tick whose publish is made to fail,
  which raises the publisher's error when it claimed something, and gives those claims back.

With partitions of the check half (the suite's ``--check-partitions``, and a second run with
three whatever the suite's), a tick is one tick of each partition's dispatcher, the refill after
a run is the run's partition's, and each job is looked for in its own partition's indexes (a
job found in another partition's would be in none of the places read).

Liveness, formulated on model time: each enabled job has an anchor, the last model time it was
placed (create, enable, a placing update, reconcile after the loss), claimed, completed, reaped
or its tenant's rate limit was cleared. A successful tick at ``now > anchor + period + lease +
interval`` must find the job leased, or held when its tenant has a rate limit. (Placement puts
the job at its next aligned tick, at most one period away; a claim's lease is reaped by the
first tick at or after its expiry; a held job waits for tokens, which the tiny bucket makes
arbitrarily slow, so held is as good as claimed while the limit is on.) Half the examples run
on one slot per region and partition, so work waits in ready and completions hand slots off;
those owe no job a run within its period, and check every other invariant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support.checks import at, register_fake_worker
from support.completion import finish
from support.partitions import Ticks, dispatchers

from celery_app.checks import dispatch
from celery_app.checks.abandon import Abandoned, abandon_run
from celery_app.checks.completion import Handoff, complete_as_read
from celery_app.checks.dispatch import refill_after_run
from celery_app.checks.jobs import JobState, ReadGuard, plan_completion, read_job
from celery_app.checks.ratelimit import KNOWN_LIMITED, clear_rate_limit, set_rate_limit
from celery_app.checks.repair import repair
from celery_app.checks.store import CheckStore
from celery_app.publish import TaskMessage
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import JobField, job_id
from celery_app.settings import Settings, load_settings
from scheduling_core import LANE_FAST, LANE_SLOW

T0 = 1_780_000_000.0
REGIONS = ("eu", "us")
TENANTS = ("acme", "globex", "initech")
UIDS = ("c0", "c1", "c2", "c3")
PERIODS = (10, 30, 60)
LANES = (LANE_FAST, LANE_SLOW)


class BrokerDown(ConnectionError):
    """What the fake publisher raises when told to fail."""


class RecordingPublisher:
    """A publisher (``publish``, ``prepare``, ``close``) that records messages, or fails."""

    def __init__(self) -> None:
        self.messages: list[TaskMessage] = []
        self.fail = False
        self.before_failing = None  # called with the messages first (a concurrent write)

    def prepare(self, names) -> None:
        pass

    def publish(self, messages) -> list[str]:
        if self.fail:
            if self.before_failing is not None:
                self.before_failing(messages)
            raise BrokerDown("the broker is down")
        self.messages.extend(messages)
        return [f"task-{len(self.messages)}-{i}" for i in range(len(messages))]

    def close(self) -> None:
        pass


@dataclass
class ModelCheck:
    tenant: str
    regions: tuple[str, ...]
    period: int
    enabled: bool = True


@dataclass
class Claimed:
    job_id: str
    token: str
    expiry: float


@dataclass
class Model:
    now: float = T0
    checks: dict[str, ModelCheck] = field(default_factory=dict)
    anchor: dict[str, float] = field(default_factory=dict)
    live: dict[str, Claimed] = field(default_factory=dict)  # job id -> its outstanding claim
    refused: list[Claimed] = field(default_factory=list)  # claims that must be refused
    limited: set[str] = field(default_factory=set)
    # each region's worker has one slot per partition: work waits in ready, and completions
    # hand their slots off; no job is then owed a run within its period
    short: bool = False


def _lifecycle_machine(client: redis.Redis, cfg: Settings, app) -> type[RuleBasedStateMachine]:
    keys = state_keys(cfg)

    class JobLifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            client.flushdb()
            self.store = CheckStore(client, keys, cfg)
            self.publisher = RecordingPublisher()
            # beat's: one dispatcher per partition
            self.dispatchers = dispatchers(app, client, publisher=self.publisher)
            # refill_after_run's own dispatchers, publishing through the same recorder
            dispatch._refillers[app] = dict(
                enumerate(dispatchers(app, client, publisher=self.publisher))
            )
            self.lease_s = self.dispatchers[0].lease_s
            self.interval = self.dispatchers[0].interval
            self.m = Model()
            self._register_workers(50)
            # the previous example's copy of the tenants with a bucket, under the same names
            KNOWN_LIMITED.forget()

        # --- helpers --------------------------------------------------------------------------
        def _register_workers(self, slots: int) -> None:
            """One shared worker per region, ``slots`` slots in each partition."""
            for part in keys.every_partition():
                for region in REGIONS:
                    register_fake_worker(
                        client, part, f"w-{region}", region=region, role="shared",
                        concurrency=slots, ttl=None,
                    )  # fmt: skip

        def _when(self):
            return at(self.m.now)

        def _jobs_of(self, uid: str) -> list[str]:
            c = self.m.checks[uid]
            return [job_id(uid, region) for region in c.regions]

        def _anchor(self, jobs, when: float | None = None) -> None:
            for j in jobs:
                self.m.anchor[j] = self.m.now if when is None else when

        def _lose(self, jobs) -> None:
            """Claims of these jobs can no longer complete (job deleted or lost)."""
            for j in jobs:
                claim = self.m.live.pop(j, None)
                if claim is not None:
                    self.m.refused.append(claim)

        def _reaped_at(self, now: float) -> list[str]:
            """The live claims a tick at ``now`` reaps (its reap runs first)."""
            gone = [j for j, c in self.m.live.items() if c.expiry <= now]
            for j in gone:
                self.m.refused.append(self.m.live.pop(j))
            return gone

        def _tick(self, *, fail: bool) -> None:
            now = self.m.now
            reaped = self._reaped_at(now)
            self._anchor(reaped)
            self.publisher.fail = fail
            if fail:
                for dispatcher in self.dispatchers:
                    try:
                        report = dispatcher.tick(now)
                    except BrokerDown:
                        pass  # there were claims to publish
                    else:
                        assert report.claims == (), "claims were published through a dead broker"
                for lease_lane in self._lease_keys():
                    # every claim of this tick was given back: only earlier leases remain
                    assert set(client.zrange(lease_lane, 0, -1)) <= set(self.m.live)
                return
            reports = Ticks()
            for dispatcher in self.dispatchers:
                try:
                    reports.reports.append(dispatcher.tick(now))
                except Exception as exc:  # no job's state may make a tick raise
                    raise AssertionError(f"the tick at {now} raised {exc!r}") from exc
            report = reports
            assert report.published == len(report.claims)
            self._record_claims([(c.job_id, c.region, c.lease_token) for c in report.claims])
            self._check_liveness(now)

        def _record_claims(self, claims) -> None:
            """Check and remember claims (job id, region, token) just taken at model time."""
            for j, region, token in claims:
                uid = j.rpartition("@")[0]
                check = self.m.checks.get(uid)
                assert check is not None, f"{j} claimed after its check was deleted"
                assert check.enabled, f"{j} claimed while its check is disabled"
                assert region in check.regions, f"{j} claimed after its region went"
                assert j not in self.m.live, (
                    f"{j} claimed again while {self.m.live[j].token} is live"
                )
                job = read_job(client, keys, j)
                assert job is not None and job.lease_token == token
                self.m.live[j] = Claimed(j, token, job.lease_expiry)
                self.m.anchor[j] = self.m.now

        def _check_liveness(self, now: float) -> None:
            if self.m.short:
                return  # more due than slots: a job waits its turn past its period
            slack = self.lease_s + self.interval + 1.0
            for uid, check in self.m.checks.items():
                if not check.enabled:
                    continue
                for j in self._jobs_of(uid):
                    if now <= self.m.anchor[j] + check.period + slack:
                        continue
                    if j in self.m.live:
                        continue
                    assert self._held_by(j) & self.m.limited, (
                        f"{j} (period {check.period}) not claimed since {self.m.anchor[j]}, "
                        f"now {now}: {self._where(j)}"
                    )

        def _lease_keys(self) -> list[str]:
            return [
                part.leases(region, lane)
                for part in keys.every_partition()
                for region in REGIONS
                for lane in LANES
            ]

        def _snapshot(self) -> dict[str, tuple[list[str], bool, str | None]]:
            """Every possible job: (the indexes that hold it, whether its hash exists, its lease
            token), read in one round trip."""
            ids = [job_id(uid, region) for uid in UIDS for region in REGIONS]
            probes: list[tuple[str, str]] = []
            for j in ids:
                region = j.rpartition("@")[2]
                probes.append((j, "due"))
                for lane in LANES:
                    probes += [(j, f"ready{lane}"), (j, f"leases{lane}")]
                    probes += [(j, f"held{lane}:{t}") for t in TENANTS]
            pipe = client.pipeline(transaction=False)
            for j, name in probes:
                region = j.rpartition("@")[2]
                home = keys.of_job(j)  # the job's indexes are its check's partition's
                if name == "due":
                    key = home.due()
                elif name.startswith("ready"):
                    key = home.ready(region, int(name[5]))
                elif name.startswith("leases"):
                    key = home.leases(region, int(name[6]))
                else:
                    key = home.held(region, int(name[4]), name.partition(":")[2])
                pipe.zscore(key, j)
            for j in ids:
                pipe.exists(keys.job(j))
                pipe.hget(keys.job(j), JobField.LEASE_TOKEN)
            replies = pipe.execute()
            where: dict[str, list[str]] = {j: [] for j in ids}
            for (j, name), score in zip(probes, replies, strict=False):
                if score is not None:
                    where[j].append(name)
            tail = replies[len(probes) :]
            return {j: (where[j], bool(tail[2 * i]), tail[2 * i + 1]) for i, j in enumerate(ids)}

        def _held_by(self, j: str, snap=None) -> set[str]:
            """The tenants whose held index holds ``j`` (in ``snap``, else read now)."""
            where = (snap or self._snapshot())[j][0]
            return {w.partition(":")[2] for w in where if w.startswith("held")}

        def _where(self, j: str) -> list[str]:
            """The indexes that hold ``j``."""
            return self._snapshot()[j][0]

        def _finish(self, claim: Claimed, at_s: float) -> bool:
            return finish(
                client,
                keys,
                self.store.settings,
                claim.job_id,
                claim.token,
                params=self.store.params,
                duration_ms=20.0,
                exec_start=at(at_s),
                now=at(at_s),
            )[0]

        # --- store writes ---------------------------------------------------------------------
        @initialize(tenant=st.sampled_from(TENANTS), limited=st.booleans(), short=st.booleans())
        def first_checks(self, tenant, limited, short):
            """Two checks of one tenant due every 10 s, maybe over a one-token bucket, maybe
            on one slot per region and partition (``Model.short``)."""
            if short:
                self.m.short = True
                self._register_workers(1)
            self.create("c0", tenant, REGIONS, 10)
            self.create("c1", tenant, ("eu",), 10)
            if limited:
                self.ratelimit_on(tenant)
            self.m.now += 12.0  # both due: start with work in flight
            self._tick(fail=False)

        @rule(
            uid=st.sampled_from(UIDS),
            tenant=st.sampled_from(TENANTS),
            regions=st.sampled_from([("eu",), ("us",), REGIONS]),
            period=st.sampled_from(PERIODS),
        )
        def create(self, uid, tenant, regions, period):
            if uid in self.m.checks:
                return
            self.store.create(
                now=self._when(), uid=uid, tenant=tenant, kind="testprobe", target="x",
                period=period, regions=list(regions),
            )  # fmt: skip
            self.m.checks[uid] = ModelCheck(tenant, tuple(regions), period)
            self._anchor(self._jobs_of(uid))

        def _existing(self, data) -> str | None:
            if not self.m.checks:
                return None
            return data.draw(st.sampled_from(sorted(self.m.checks)))

        @rule(data=st.data(), tenant=st.sampled_from(TENANTS))
        def update_tenant(self, data, tenant):
            uid = self._existing(data)
            if uid is None:
                return
            self.store.update(uid, now=self._when(), tenant=tenant)
            self.m.checks[uid].tenant = tenant

        @rule(data=st.data(), tenant=st.sampled_from(TENANTS))
        def update_tenant_of_a_held_job(self, data, tenant):
            """The tenant change that matters most: of a check whose job the bucket holds."""
            held = sorted(
                uid for uid in self.m.checks for j in self._jobs_of(uid) if self._held_by(j)
            )
            if not held:
                return
            uid = data.draw(st.sampled_from(held))
            self.store.update(uid, now=self._when(), tenant=tenant)
            self.m.checks[uid].tenant = tenant

        @rule(data=st.data(), regions=st.sampled_from([("eu",), ("us",), REGIONS, ("us", "eu")]))
        def update_regions(self, data, regions):
            uid = self._existing(data)
            if uid is None:
                return
            check = self.m.checks[uid]
            old = set(self._jobs_of(uid))
            self.store.update(uid, now=self._when(), regions=list(regions))
            check.regions = tuple(regions)
            new = set(self._jobs_of(uid))
            self._lose(old - new)
            if check.enabled:
                self._anchor(new - set(self.m.live))  # re-placed unless leased

        @rule(data=st.data(), period=st.sampled_from(PERIODS))
        def update_period(self, data, period):
            uid = self._existing(data)
            if uid is None:
                return
            check = self.m.checks[uid]
            changed = check.period != period
            self.store.update(uid, now=self._when(), period=period)
            check.period = period
            if changed and check.enabled:
                self._anchor(set(self._jobs_of(uid)) - set(self.m.live))

        @rule(data=st.data(), weight=st.sampled_from([0, 3, 50]))
        def update_weight(self, data, weight):
            uid = self._existing(data)
            if uid is not None:
                self.store.update(uid, now=self._when(), plan_weight=weight)

        @rule(data=st.data(), address=st.sampled_from(["x", "y"]))
        def update_target(self, data, address):
            uid = self._existing(data)
            if uid is not None:
                self.store.update(uid, now=self._when(), target=address)

        @rule(data=st.data())
        def disable(self, data):
            uid = self._existing(data)
            if uid is None:
                return
            self.store.set_enabled(uid, False, now=self._when())
            self.m.checks[uid].enabled = False

        @rule(data=st.data())
        def enable(self, data):
            uid = self._existing(data)
            if uid is None:
                return
            was = self.m.checks[uid].enabled
            self.store.set_enabled(uid, True, now=self._when())
            self.m.checks[uid].enabled = True
            if not was:
                self._anchor(self._jobs_of(uid))

        @rule(data=st.data())
        def delete(self, data):
            uid = self._existing(data)
            if uid is None:
                return
            jobs = self._jobs_of(uid)
            assert self.store.delete(uid)
            del self.m.checks[uid]
            self._lose(jobs)

        # --- rate limits ----------------------------------------------------------------------
        @rule(tenant=st.sampled_from(TENANTS))
        def ratelimit_on(self, tenant):
            set_rate_limit(client, keys, tenant, per_minute=1, burst=1)
            self.m.limited.add(tenant)
            # The hand-off's copy of the tenants with a bucket is dropped with every change, so
            # that whether it is fresh (this process's wall clock) changes no outcome: a replay
            # of an example must take the same path. The copy's bound is tested apart
            # (test_completion_handoff).
            KNOWN_LIMITED.forget()

        @rule(tenant=st.sampled_from(TENANTS))
        def ratelimit_off(self, tenant):
            # the tenant's held jobs are released by the next tick: their wait starts now
            snap = self._snapshot()
            held = [j for j in self.m.anchor if tenant in self._held_by(j, snap)]
            clear_rate_limit(client, keys, tenant)
            self.m.limited.discard(tenant)
            KNOWN_LIMITED.forget()  # as in ratelimit_on
            self._anchor(held)

        # --- the dispatcher -------------------------------------------------------------------
        @rule(seconds=st.sampled_from([0.0, 0.5, 5.0, 12.0]))
        def tick(self, seconds):
            self.m.now += seconds
            self._tick(fail=False)

        @rule(seconds=st.sampled_from([0.0, 5.0, 12.0]))
        def tick_with_publish_failure(self, seconds):
            self.m.now += seconds
            self._tick(fail=True)

        @rule(seconds=st.sampled_from([0.0, 5.0, 12.0]))
        def tick_disabling_a_check_during_its_failed_publish(self, seconds):
            """The check of the first claim is disabled between its claim and the publish
            failure (another process's write): the release must not put it back."""

            def disable_first(messages) -> None:
                uid = messages[0].kwargs["job_id"].rpartition("@")[0]
                self.store.set_enabled(uid, False, now=self._when())
                self.m.checks[uid].enabled = False

            self.publisher.before_failing = disable_first
            try:
                self.m.now += seconds
                self._tick(fail=True)
            finally:
                self.publisher.before_failing = None

        @rule()
        def reap(self):
            if not self.m.live:
                return
            self.m.now = max(c.expiry for c in self.m.live.values()) + 0.5
            self._tick(fail=False)

        @rule(seconds=st.sampled_from([0.5, 3.0, 11.0, 25.0, 70.0]))
        def advance_time(self, seconds):
            self.m.now += seconds

        # --- workers --------------------------------------------------------------------------
        @precondition(lambda self: any(c.expiry > self.m.now for c in self.m.live.values()))
        @rule(data=st.data(), run_s=st.sampled_from([0.0, 4.0, 11.0]))
        def complete_on_time(self, data, run_s):
            """The worker's own path: the run (``run_s`` long, within its lease) is written
            back, then ``refill_after_run`` claims and publishes work for the slot it freed
            (the dispatcher's atomic claim): what fell due meanwhile is claimed at once."""
            on_time = sorted(j for j, c in self.m.live.items() if c.expiry > self.m.now)
            j = data.draw(st.sampled_from(on_time))
            claim = self.m.live.pop(j)
            self.m.now = max(self.m.now, min(self.m.now + run_s, claim.expiry - 0.1))
            assert self._finish(claim, self.m.now), f"{j} refused on time"
            self.m.anchor[j] = self.m.now
            sent = len(self.publisher.messages)
            self.publisher.fail = False
            region = j.rpartition("@")[2]
            try:
                count = refill_after_run(
                    app, region, self.m.now, partition=keys.of_job(j).partition
                )
            except Exception as exc:
                raise AssertionError(f"the refill at {self.m.now} raised {exc!r}") from exc
            published = [m.kwargs for m in self.publisher.messages[sent:]]
            assert count == len(published)
            self._record_claims([(k["job_id"], region, k["lease_token"]) for k in published])

        @precondition(lambda self: any(c.expiry > self.m.now for c in self.m.live.values()))
        @rule(
            data=st.data(),
            run_s=st.sampled_from([0.0, 4.0]),
            live=st.sampled_from([None, True, False]),
        )
        def complete_handing_off(self, data, run_s, live):
            """The worker's path with a start read (``workers.post_exec``): the write planned
            from the job as the run read it hands the freed slot, in the same call, to the
            region's next ready job when a full claim would weigh nothing (``live``: whether
            the slot is live as the registering process knows it; None: the worker's hash
            says); else the refill claims, as after ``complete_on_time``."""
            on_time = sorted(j for j, c in self.m.live.items() if c.expiry > self.m.now)
            j = data.draw(st.sampled_from(on_time))
            claim = self.m.live.pop(j)
            self.m.now = max(self.m.now, min(self.m.now + run_s, claim.expiry - 0.1))
            part = keys.of_job(j)
            h = client.hgetall(part.job(j))
            guard = ReadGuard.of(h, client.get(part.maintenance_version()))
            run = plan_completion(
                self.store.params, JobState.from_hash(j, h), claim.token, now=at(self.m.now),
                duration_ms=20.0, timed_out=False, exec_start=at(self.m.now),
            )  # fmt: skip
            region = j.rpartition("@")[2]
            handoff = Handoff(f"w-{region}", region, self.lease_s, now=self.m.now, live=live)
            done = complete_as_read(client, part, run, guard, handoff, results_maxlen=10)
            assert done is not None and done.written, f"{j} refused on time"
            self.m.anchor[j] = self.m.now
            handed = handoff.claim_of(done.handed)
            if handed is not None:
                assert handed.job_id != j and live is not False
                self._record_claims([(handed.job_id, region, handed.lease_token)])
                return
            sent = len(self.publisher.messages)
            self.publisher.fail = False
            count = refill_after_run(app, region, self.m.now, partition=part.partition)
            published = [m.kwargs for m in self.publisher.messages[sent:]]
            assert count == len(published)
            self._record_claims([(k["job_id"], region, k["lease_token"]) for k in published])

        @precondition(lambda self: bool(self.m.live))
        @rule(data=st.data())
        def complete_late(self, data):
            """Past the lease's expiry, before a tick reaped it: still the job's lease."""
            j = data.draw(st.sampled_from(sorted(self.m.live)))
            claim = self.m.live.pop(j)
            self.m.now = max(self.m.now, claim.expiry + 0.25)
            assert self._finish(claim, self.m.now), f"{j} refused before it was reaped"
            self.m.anchor[j] = self.m.now

        @precondition(lambda self: bool(self.m.refused))
        @rule(data=st.data())
        def complete_after_reap(self, data):
            claim = data.draw(st.sampled_from(self.m.refused))
            assert not self._finish(claim, self.m.now), f"{claim.job_id} accepted after reap"

        @precondition(lambda self: bool(self.m.live))
        @rule(data=st.data())
        def abandon_before_probe(self, data):
            """The run raised before its probe (before a tick reaped it): its lease is given
            back and its job placed at its next tick at once; its completion is then refused,
            and so is a second abandon."""
            j = data.draw(st.sampled_from(sorted(self.m.live)))
            claim = self.m.live.pop(j)
            done = self._abandon(claim)
            assert done.result == Abandoned.RELEASED, f"{j} not released: {done.result}"
            assert self._abandon(claim).result == Abandoned.LEASE_GONE
            self.m.refused.append(claim)
            self.m.anchor[j] = self.m.now

        @precondition(lambda self: bool(self.m.refused))
        @rule(data=st.data())
        def abandon_after_reap(self, data):
            """A run whose lease was reaped, completed elsewhere or lost raises: nothing moves."""
            claim = data.draw(st.sampled_from(self.m.refused))
            before = client.hgetall(keys.job(claim.job_id))
            assert self._abandon(claim).result == Abandoned.LEASE_GONE
            assert client.hgetall(keys.job(claim.job_id)) == before

        def _abandon(self, claim: Claimed):
            job = read_job(client, keys, claim.job_id)
            tick = job.scheduled_at if job is not None else self.m.now
            return abandon_run(
                client, keys.of_job(claim.job_id), self.store.params, claim.job_id, claim.token,
                "celery-id", scheduled_at=tick, now=self.m.now,
            )  # fmt: skip

        # --- repair ---------------------------------------------------------------------------
        @rule()
        def reconcile(self):
            report = repair(client, keys, self.store.params, self._when())
            assert report.placed == () and report.leases_restored == ()
            assert report.conflicts == ()

        @rule()
        def flush_and_reconcile(self):
            """Every job and index key lost (a restore from an old snapshot): definitions,
            buckets, workers and the lease sequence survive; reconcile rebuilds the jobs."""
            lost = [*self._lease_keys()]
            for part in keys.every_partition():
                lost.append(part.due())
                for region in REGIONS:
                    lost.append(part.held_tenants(region))
                    for lane in LANES:
                        lost.append(part.ready(region, lane))
                        lost += [part.held(region, lane, t) for t in TENANTS]
            lost += [keys.job(job_id(uid, region)) for uid in UIDS for region in REGIONS]
            client.delete(*lost)
            self._lose(list(self.m.live))
            report = repair(client, keys, self.store.params, self._when())
            enabled = [
                j for uid, c in self.m.checks.items() if c.enabled for j in self._jobs_of(uid)
            ]
            assert sorted(report.placed) == sorted(enabled)
            self._anchor(enabled)

        # --- invariants -----------------------------------------------------------------------
        @invariant()
        def every_job_is_where_its_check_says(self):
            expected: dict[str, bool] = {}
            for uid, check in self.m.checks.items():
                for j in self._jobs_of(uid):
                    expected[j] = check.enabled
            for j, (where, exists, token) in self._snapshot().items():
                leased = [w for w in where if w.startswith("leases")]
                assert bool(token) == bool(leased), (  # '' once a run released it
                    f"{j}: lease token {token} but lease index entries {leased}"
                )
                if token is not None and j in self.m.live:
                    assert self.m.live[j].token == token
                if j not in expected:
                    assert where == [] and not exists, f"{j} (gone) is in {where}, hash {exists}"
                elif expected[j]:
                    assert exists, f"{j} (enabled) has no hash"
                    assert len(where) == 1, f"{j} (enabled) is in {where}"
                else:  # disabled: no hash after a loss (enabling places it), or in no index
                    assert where == leased and len(leased) <= 1, f"{j} (disabled) is in {where}"

    return JobLifecycle


@pytest.fixture
def lifecycle_settings(redis_url: str, broker_url: str) -> Settings:
    """The suite's settings (its ``--check-partitions``)."""
    return load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=list(REGIONS)
    )


@pytest.fixture
def partitioned_settings(redis_url: str, broker_url: str) -> Settings:
    """Three partitions of the check half, whatever the suite's: c0 and c3 live in partition 0,
    c2 in 1, c1 in 2, so every partition holds a check and c0's regions and c1's share none."""
    cfg = load_settings(
        redis_url=redis_url, broker_url=broker_url, key_prefix="cbtest", regions=list(REGIONS),
        check_partitions=3,
    )  # fmt: skip
    keys = state_keys(cfg)
    assert {uid: keys.of_check(uid).partition for uid in UIDS} == {
        "c0": 0, "c1": 2, "c2": 1, "c3": 0,
    }  # fmt: skip
    return cfg


def _run(r, lifecycle_settings, examples: int, steps: int) -> None:
    from celery_app.factory import create_app

    app = create_app(lifecycle_settings)
    machine = _lifecycle_machine(r, lifecycle_settings, app)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_job_lifecycle_keeps_its_invariants(r, lifecycle_settings, test_kind):
    _run(r, lifecycle_settings, examples=40, steps=30)


def test_job_lifecycle_keeps_its_invariants_over_partitions(r, partitioned_settings, test_kind):
    """The same model over three partitions: one dispatcher and one refill dispatcher per
    partition, each check's job, indexes and lease in its own partition's keys."""
    _run(r, partitioned_settings, examples=25, steps=30)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_job_lifecycle_keeps_its_invariants_long(r, lifecycle_settings, test_kind):
    _run(r, lifecycle_settings, examples=150, steps=40)
