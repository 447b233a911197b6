"""Per-tenant token buckets: deferral keeps the old effective deadline, so nobody starves."""

from __future__ import annotations

from collections import defaultdict

import pytest
from support.checks import at, learned, register_fake_worker
from support.completion import finish
from support.partitions import pinned, suite_partitions

from celery_app.checks.dispatch import Dispatcher
from celery_app.checks.jobs import read_job
from celery_app.checks.ratelimit import clear_rate_limit, get_rate_limit, set_rate_limit
from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.errors import CheckFieldError

T0 = 1_780_000_000.0
#: The checks of these tests share the first partition of the check half, whose share of a
#: tenant's bucket is its rate and burst / P: the buckets below are P times theirs, so the first
#: partition's is the bucket each test reasons about, whatever the suite's partition count.
P = suite_partitions()


def U(name: str) -> str:
    """The uid of check ``name``, in the first partition."""
    return pinned(P, name)


def J(name: str) -> str:
    """The job of check ``name`` in region eu."""
    return f"{U(name)}@eu"


def test_bucket_settings_are_validated(r, keys):
    with pytest.raises(CheckFieldError) as info:
        set_rate_limit(r, keys, "acme", per_minute=0, burst=5)
    assert info.value.field == "per_minute"
    with pytest.raises(CheckFieldError) as info:
        set_rate_limit(r, keys, "acme", per_minute=5, burst=0.5)
    assert info.value.field == "burst"
    assert r.dbsize() == 0
    assert set_rate_limit(r, keys, "acme", per_minute=20, burst=5).tokens == 5
    assert clear_rate_limit(r, keys, "acme") and get_rate_limit(r, keys, "acme") is None


def simulate(r, keys, store, app, minutes: int, *, step: float = 1.0):
    """Tick a dispatcher on a simulated clock; every claimed run finishes 50 ms later."""
    d = Dispatcher(app, client=r)
    runs: dict[str, list[float]] = defaultdict(list)
    now = T0
    while now < T0 + minutes * 60:
        for claim in d.tick(now).claims:
            assert finish(
                r,
                keys,
                store.settings,
                claim.job_id,
                claim.lease_token,
                params=store.params,
                duration_ms=50.0,
                exec_start=at(now),
                now=at(now + 0.05),
                record=RunRecord(RunStatus.UP, "eu", finished_at=now + 0.05),
            )[0]
            runs[claim.job_id].append(now)
        now += step
    return runs


def _one_minute_checks(store, tenant: str, uids: list[str]) -> None:
    """Checks every 60 s in region eu, created at T0."""
    for uid in uids:
        store.create(
            now=at(T0), uid=U(uid), tenant=tenant, kind="testprobe", target="x", period=60,
            regions=["eu"],
        )  # fmt: skip


@pytest.mark.timeout(120)
def test_a_tenant_over_its_bucket_runs_every_check_within_three_windows(
    r, keys, store, dispatcher_app, broker
):
    _one_minute_checks(store, "acme", [f"rl{i:02d}" for i in range(60)])
    # another tenant without a bucket is not held back by acme's
    _one_minute_checks(store, "globex", [f"free{i}" for i in range(5)])
    set_rate_limit(r, keys, "acme", per_minute=20 * P, burst=20 * P)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=100, ttl=None)
    minutes = 30
    runs = simulate(r, keys, store, dispatcher_app, minutes)

    acme = {j: t for j, t in runs.items() if j.startswith("rl")}
    assert len(acme) == 60, "every one of the tenant's checks ran"
    total = sum(len(t) for t in acme.values())
    assert total <= 20 + 20 * minutes + 1  # burst + rate: the bucket holds
    assert total >= 20 * minutes - 20  # and the tenant gets its whole rate
    end = T0 + minutes * 60
    for job, times in acme.items():
        gaps = [b - a for a, b in zip([T0, *times], [*times, end], strict=True)]
        assert max(gaps) <= 3 * 60 + 2, f"{job} waited {max(gaps)} s between runs"
    for i in range(5):
        assert len(runs[J(f"free{i}")]) >= minutes - 1
    # deferred jobs counted the ticks they skipped
    assert sum(read_job(r, keys, j).skipped for j in acme) > 0


def test_a_deferred_job_keeps_its_old_effective_deadline(r, keys, store, dispatcher_app, broker):
    for uid in ("a", "b"):
        store.create(
            now=at(T0),
            uid=U(uid),
            tenant="acme",
            kind="testprobe",
            target="x",
            period=60,
            regions=["eu"],
        )
    set_rate_limit(r, keys, "acme", per_minute=0.4 * P, burst=P)  # one token per 150 s
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=10, ttl=None)
    d = Dispatcher(dispatcher_app, client=r)
    jobs = {j: read_job(r, keys, j) for j in (J("a"), J("b"))}
    first, second = sorted(jobs.values(), key=lambda j: j.effective_scheduled_at)
    start = second.scheduled_at + 0.5
    report = d.tick(start)
    assert [c.job_id for c in report.claims] == [first.job_id]
    assert report.rate_limited == 1
    claim = report.claims[0]
    assert finish(
        r,
        keys,
        store.settings,
        claim.job_id,
        claim.lease_token,
        params=store.params,
        duration_ms=5.0,
        now=at(start + 1),
    )[0]
    # two of the loser's ticks pass without a token: it waits in acme's held index at its old
    # effective deadline (it recedes, so it wins the next token); other tenants never see it
    for later in (start + 70, start + 130):
        assert d.tick(later).claims == ()
    waiting = read_job(r, keys, second.job_id)
    assert waiting.effective_scheduled_at == second.effective_scheduled_at
    assert r.zscore(keys.held("eu", 0, "acme"), second.job_id) == pytest.approx(
        second.effective_scheduled_at
    )
    assert r.zscore(keys.ready("eu", 0), second.job_id) is None
    # the winner is due again too, with a newer deadline: the next token goes to the loser
    assert r.zscore(keys.held("eu", 0, "acme"), first.job_id) > second.effective_scheduled_at
    assert [c.job_id for c in d.tick(start + 151).claims] == [second.job_id]
    ran = read_job(r, keys, second.job_id)
    assert ran.skipped == 2  # the two ticks it missed are counted as skipped runs
    assert ran.scheduled_at == pytest.approx(second.scheduled_at + 120)
    assert r.zrange(keys.held("eu", 0, "acme"), 0, -1) == [first.job_id]


def test_a_limited_tenant_ahead_in_line_does_not_hold_back_others(
    r, keys, store, dispatcher_app, broker
):
    _one_minute_checks(store, "acme", [f"a{i:03d}" for i in range(100)])
    _one_minute_checks(store, "globex", [f"b{i}" for i in range(5)])
    for i in range(100):  # acme's jobs are all older than globex's
        learned(r, keys, store.params, J(f"a{i:03d}"), scheduled_at=T0 + i * 0.01)
    for i in range(5):
        learned(r, keys, store.params, J(f"b{i}"), scheduled_at=T0 + 10)
    set_rate_limit(r, keys, "acme", per_minute=2 * P, burst=2 * P)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=7, ttl=None)
    report = Dispatcher(dispatcher_app, client=r).tick(T0 + 11)
    claimed = sorted(c.job_id for c in report.claims)
    # acme's burst (2, its oldest) and then globex's 5, found past 98 limited acme jobs
    assert claimed == [J("a000"), J("a001")] + [J(f"b{i}") for i in range(5)]
    assert report.rate_limited == 98
    assert r.zcard(keys.held("eu", 0, "acme")) == 98


def test_removing_the_bucket_releases_held_jobs_and_deleting_a_check_unholds_it(
    r, keys, store, dispatcher_app, broker
):
    _one_minute_checks(store, "acme", [f"h{i}" for i in range(4)])
    for i in range(4):
        learned(r, keys, store.params, J(f"h{i}"), scheduled_at=T0 + i)
    set_rate_limit(r, keys, "acme", per_minute=1 * P, burst=P)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=10, ttl=None)
    d = Dispatcher(dispatcher_app, client=r)
    assert [c.job_id for c in d.tick(T0 + 5).claims] == [J("h0")]
    assert r.zcard(keys.held("eu", 0, "acme")) == 3
    store.delete(U("h3"))
    assert r.zrange(keys.held("eu", 0, "acme"), 0, -1) == [J("h1"), J("h2")]
    clear_rate_limit(r, keys, "acme")
    assert [c.job_id for c in d.tick(T0 + 6).claims] == [J("h1"), J("h2")]
    assert not r.exists(keys.held("eu", 0, "acme"))
    assert not r.sismember(keys.held_tenants("eu"), "acme")


def _hold_one(r, keys, store, app):
    """h0 and h1 of acme due, acme's bucket one token: h0 is claimed, h1 held. The dispatcher."""
    _one_minute_checks(store, "acme", ["h0", "h1"])
    for i in range(2):
        learned(r, keys, store.params, J(f"h{i}"), scheduled_at=T0 + i)
    set_rate_limit(r, keys, "acme", per_minute=0.01 * P, burst=P)
    register_fake_worker(r, keys, "w", region="eu", role="shared", concurrency=10, ttl=None)
    d = Dispatcher(app, client=r)
    report = d.tick(T0 + 5)
    assert [c.job_id for c in report.claims] == [J("h0")]
    assert r.zrange(keys.held("eu", 0, "acme"), 0, -1) == [J("h1")]
    return d, report.claims[0]


def test_a_held_job_moved_to_another_tenant_leaves_the_old_held_index_and_runs_once(
    r, keys, store, dispatcher_app, broker
):
    d, _ = _hold_one(r, keys, store, dispatcher_app)
    score = r.zscore(keys.held("eu", 0, "acme"), J("h1"))
    store.update(U("h1"), now=at(T0 + 6), tenant="globex")
    assert r.zscore(keys.held("eu", 0, "acme"), J("h1")) is None
    assert r.zscore(keys.ready("eu", 0), J("h1")) == score  # its old deadline, unlimited now
    assert [c.job_id for c in d.tick(T0 + 7).claims] == [J("h1")]
    clear_rate_limit(r, keys, "acme")  # acme's held jobs are released: h1 is none of them
    assert d.tick(T0 + 8).claims == ()


def test_reconcile_counts_a_job_held_by_another_tenant_as_indexed(
    r, keys, store, dispatcher_app, broker
):
    from celery_app.checks.repair import repair

    _hold_one(r, keys, store, dispatcher_app)
    store.update(U("h1"), now=at(T0 + 6), tenant="globex")
    # the state a tenant change left before it moved held jobs: held by the old tenant
    score = r.zscore(keys.ready("eu", 0), J("h1")) or r.zscore(keys.held("eu", 0, "acme"), J("h1"))
    r.zrem(keys.ready("eu", 0), J("h1"))
    r.zadd(keys.held("eu", 0, "acme"), {J("h1"): score})
    report = repair(r, keys, store.params, at(T0 + 7))
    assert J("h1") not in report.placed
    assert r.zscore(keys.due(), J("h1")) is None


def test_the_held_release_never_claims_a_job_with_a_live_lease(
    r, keys, store, dispatcher_app, broker
):
    d, claim = _hold_one(r, keys, store, dispatcher_app)
    # a stray held entry of the leased h0 (what a tenant change plus reconcile once left)
    r.zadd(keys.held("eu", 0, "acme"), {J("h0"): 0.0})
    clear_rate_limit(r, keys, "acme")
    assert [c.job_id for c in d.tick(T0 + 6).claims] == [J("h1")]
    assert read_job(r, keys, J("h0")).lease_token == claim.lease_token
    assert r.zscore(keys.ready("eu", 0), J("h0")) is None
    assert not r.exists(keys.held("eu", 0, "acme"))
