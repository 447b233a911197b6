"""The check half in 12 partitions on a real three-master Redis Cluster (each master with a
replica), with real processes: two ``celery beat`` (checkbeat's scheduler, one dispatcher per
partition) and one check worker per region (``eu``, ``us``), the broker on a separate plain
redis-server, checks of a 2 s period probing a real HTTP server on 127.0.0.1 per region.

What is measured:

* where the keys are: one check per partition, so four checks (and four partitions' indexes)
  on each master, counted on each master itself;
* no ``CROSSSLOT`` (nor redis-py's own "same slot" refusal) in any process's log;
* per job (check, region) and per phase-aligned tick over a window: the requests the target
  received against the ticks due (tests/support/tick_ledger.py): no tick probed twice, none
  missed;
* transitions: half the checks flip down then up in both regions; each makes exactly one
  transition each way, and each is delivered once to the ``@on_transition`` hook
  (tests/cluster_hooks.py, which records to a Redis outside the cluster);
* a failover: one master SIGKILLed mid-runs and its replica promoted (``CLUSTER FAILOVER
  TAKEOVER``): no tick probed twice, and every tick not probed is one checkbeat reports (a
  reaper's ``lost`` record naming it, or the job's abandoned / skipped / passed-over counters).

Each check's regions share its partition (the quorum and its transition stay one script on one
slot), so "a check's regions on different masters" does not occur by design; the checks are
spread over every master instead, and every master makes transitions.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from cluster_hooks import RECORD_ENV, delivered
from redis.crc import key_slot
from support.checks import results
from support.flip_server import FlipServer
from support.polling import wait_for
from support.processes import Processes
from support.tick_ledger import TickLedger
from support.workers import REPO

from celery_app.checks.check_state import read_transitions
from celery_app.checks.store import CheckStore
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import JobField, job_id, partition_of, partition_tags
from celery_app.settings import load_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 12
REGIONS = ("eu", "us")
PERIOD_S = 2
PROBE_S = 0.3  # the failover test's probes on the killed master: some is in flight
#: A job of the killed master's loses at most the ticks its lease spans (CHECKBEAT_CHECK_TIMEOUT
#: 2 s + CHECKBEAT_LEASE_MARGIN 1 s: a run whose completion died with the master is reaped at
#: its expiry), one period each, and the tick of the run cut off.
MAX_LOST_TICKS = 3
#: With WAIT on, the beats stall a WAIT timeout (one period here) on the promoted master, which
#: has no replica, once per replication.DEGRADED_S: over the window after the failover (four
#: periods) each stall may pass over one more tick, reported like the others.
STALL_LOST_TICKS = 2
#: More than loopback's socket buffers hold: what follows it on the replication link stays in
#: the master's memory while the replica is stopped, and dies with the master.
LINK_FILLER_BYTES = 64 * 1024 * 1024
HOOK_QUEUE = "cbtest.cluster.transitions"
RECORD_DB = 2  # of the broker's redis-server: the hook's witness, outside the cluster
#: Every worker has at least PARTITIONS slots (docs/scale.md): two per partition here.
SLOTS = 2 * PARTITIONS


CROSS_SLOT = re.compile(r"CROSSSLOT|same (key )?slot", re.IGNORECASE)


def _one_check_per_partition() -> list[str]:
    """Twelve uids, the first found in each partition."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < PARTITIONS:
        found.setdefault(partition_of(f"cp{n}", PARTITIONS), f"cp{n}")
        n += 1
    return [found[p] for p in range(PARTITIONS)]


CHECKS = _one_check_per_partition()


def _slot_of_partition(partition: int) -> int:
    return key_slot(partition_tags(PARTITIONS)[partition].strip("{}").encode())


class System:
    """The cluster, the target, two beats and a worker per region, and what the test reads."""

    def __init__(
        self, cluster, tmp_path: Path, target: FlipServer, env: dict[str, str] | None = None
    ) -> None:
        self.cluster = cluster
        self.target = target
        state_url, broker_url = cluster.url(), cluster.broker_url()
        record_url = cluster.broker.url(RECORD_DB)
        self.record = redis.Redis.from_url(record_url, decode_responses=True)
        self.record.flushdb()
        self.env = {
            "CHECKBEAT_REDIS_URL": state_url,
            "CHECKBEAT_BROKER_URL": broker_url,
            "CHECKBEAT_CHECK_PARTITIONS": str(PARTITIONS),
            "CHECKBEAT_REGIONS": ",".join(REGIONS),
            "CHECKBEAT_IMPORTS": "cluster_hooks",
            "CHECKBEAT_TRANSITION_QUEUE": HOOK_QUEUE,
            "CHECKBEAT_TRANSITION_TIMEOUT": "3",
            "CHECKBEAT_DISPATCH_INTERVAL": "0.2",
            "CHECKBEAT_CHECK_TIMEOUT": "2",
            "CHECKBEAT_LEASE_MARGIN": "1",
            "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
            RECORD_ENV: record_url,
            **(env or {}),
        }
        self.settings = load_settings(
            redis_url=state_url,
            broker_url=broker_url,
            check_partitions=PARTITIONS,
            regions=list(REGIONS),
        )
        self.keys = state_keys(self.settings)
        self.client = get_redis(state_url, self.settings)
        self.procs = Processes(tmp_path)

    def start(self) -> None:
        for region in REGIONS:
            queues = f"checks.{region}.fast,checks.{region}.slow,{HOOK_QUEUE}"
            self.procs.celery(
                f"worker-{region}", "worker", "--without-mingle", "--without-gossip", "-l",
                "INFO", "-P", "threads", "-c", str(SLOTS), "-Q", queues, "-n", f"{region}@cp",
                **self.env,
            )  # fmt: skip
        for n in range(2):
            schedule = str(self.procs.log_dir / f"beat-{n}-schedule")
            self.procs.celery(
                f"beat-{n}", "beat", "-l", "INFO", "--pidfile=", "-s", schedule, **self.env
            )
        for region in REGIONS:
            wait_for(
                lambda r=region: self.client.exists(self.keys.at(0).worker(f"{r}@cp")),
                90,
                what=lambda r=region: f"the {r} worker's registration\n{self.logs()}",
            )
        store = CheckStore.from_settings(self.settings)
        for uid in CHECKS:
            store.create(
                uid=uid, tenant=f"t{int(uid[2:]) % 3}", kind="cluster_regional",
                target=f"{self.target.url}/{uid}", period=PERIOD_S, regions=list(REGIONS),
                failure_threshold=1, success_threshold=1,
            )  # fmt: skip

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{self.procs.output(name)[-3000:]}" for name, _p, _l in self.procs.started
        )

    def hits(self, uid: str, region: str) -> list[float]:
        return self.target.hit_times(f"{uid}/{region}")

    def steady_window(self, slow: list[str]) -> tuple[float, dict[tuple[str, str], int]]:
        """``slow`` checks' targets answer after PROBE_S; once every job runs steadily, a
        window starts: its start, and the ticks each job had reported not run before it."""
        for uid in slow:
            for region in REGIONS:
                self.target.set_delay(f"{uid}/{region}", PROBE_S)
        wait_for(
            lambda: self.every_job_hit_since(0, 2), 90, what=lambda: f"steady runs\n{self.logs()}"
        )
        window_start = time.time()
        before = {(uid, g): self.counters(uid, g) for uid in CHECKS for g in REGIONS}
        wait_for(lambda: self.every_job_hit_since(window_start, 2), 30, what="runs in the window")
        return window_start, before

    def runs_again_after(self, since: float) -> None:
        """Every job runs again after ``since`` (a failover is over), or fail naming those that
        did not, with the processes' logs of that moment."""
        wait_for(
            lambda: self.every_job_hit_since(since, 1),
            60,
            what=lambda: (
                f"runs after the failover: {self.not_hit_since(since)} not run since "
                f"{since:.3f}\n{self.logs()}"
            ),
        )

    def every_job_hit_since(self, since: float, at_least: int) -> bool:
        return all(
            sum(h >= since for h in self.hits(uid, region)) >= at_least
            for uid in CHECKS
            for region in REGIONS
        )

    def not_hit_since(self, since: float) -> list[str]:
        return [
            f"{uid}@{region}"
            for uid in CHECKS
            for region in REGIONS
            if not any(h >= since for h in self.hits(uid, region))
        ]

    def counters(self, uid: str, region: str) -> int:
        """The job's ticks reported as not run: abandoned, skipped by a rate limit, passed."""
        counted = (JobField.ABANDONED, JobField.SKIPPED, JobField.PASSED)
        values = self.client.hmget(self.keys.job(job_id(uid, region)), counted)
        return sum(int(x or 0) for x in values)

    def ledger(self, uid: str, region: str, first: float, last: float) -> TickLedger:
        sa = float(self.client.hget(self.keys.job(job_id(uid, region)), JobField.SCHEDULED_AT))
        return TickLedger(PERIOD_S, int(sa) % PERIOD_S, first, last).count(
            self.hits(uid, region), results(self.client, self.keys, uid, region)
        )

    def cross_slot_lines(self) -> list[str]:
        return [
            f"{name}: {line}"
            for name, _p, _l in self.procs.started
            for line in self.procs.output(name).splitlines()
            if CROSS_SLOT.search(line)
        ]

    def stop(self) -> None:
        self.procs.stop()
        self.record.close()


@pytest.fixture
def system(redis_cluster_with_replicas, tmp_path, request):
    """The running system; a test parametrizes it indirectly with settings of its own (env)."""
    import cluster_hooks  # noqa: F401 - the kind, in this process too (the store validates)

    with FlipServer() as target:
        env = getattr(request, "param", None)
        running = System(redis_cluster_with_replicas, tmp_path, target, env)
        try:
            running.start()
            yield running
        finally:
            running.stop()


def _keys_per_master(system: System) -> dict[int, Counter[str]]:
    """Per master (its port): how many job hashes of each check it holds, read on itself."""
    prefix = system.settings.key_prefix
    found: dict[int, Counter[str]] = {}
    for node in system.cluster.current_masters():
        with node.client() as direct:
            jobs = [
                k.rpartition(":job:")[2]
                for k in direct.scan_iter(match=f"{prefix}:*:job:*", count=1000)
            ]
        found[node.port] = Counter(j.rpartition("@")[0] for j in jobs)
    return found


def test_twelve_partitions_spread_over_three_masters_and_run_each_tick_once(system):
    wait_for(
        lambda: system.every_job_hit_since(0, 2), 90, what=lambda: f"steady runs\n{system.logs()}"
    )

    # one check per partition, four partitions per master: each master holds 4 checks' jobs
    per_master = _keys_per_master(system)
    cluster = system.cluster
    expected = Counter(cluster.node_of_slot(_slot_of_partition(p)).port for p in range(12))
    assert sorted(expected.values()) == [4, 4, 4], expected
    for port, jobs in per_master.items():
        assert len(jobs) == expected[port] == 4, per_master
        assert set(jobs.values()) == {len(REGIONS)}, per_master  # every region's job
    print(f"checks per master: { {port: sorted(j) for port, j in per_master.items()} }")

    window_start = time.time()
    flipped = CHECKS[::2]  # two on each master (partitions 0, 2, ... of four per master)
    wait_for(lambda: system.every_job_hit_since(window_start, 1), 30, what="runs in the window")
    system.target.fail(*(f"{uid}/{region}" for uid in flipped for region in REGIONS))

    def check_state(uid: str) -> str:
        return system.client.hget(system.keys.check_state(uid), "s") or "up"

    wait_for(lambda: all(check_state(uid) == "down" for uid in flipped), 30, what="flipped down")
    system.target.heal(*(f"{uid}/{region}" for uid in flipped for region in REGIONS))
    wait_for(lambda: all(check_state(uid) == "up" for uid in flipped), 30, what="back up")
    window_end = max(time.time(), window_start + 6 * PERIOD_S)
    wait_for(
        lambda: system.every_job_hit_since(window_end + PERIOD_S, 1),
        30,
        what=lambda: f"runs past the window\n{system.logs()}",
    )

    def made(uid: str) -> list[dict]:
        return list(reversed(read_transitions(system.client, system.keys.check_transitions(uid))))

    wait_for(lambda: len(delivered(system.record)) >= 2 * len(flipped), 30, what="deliveries")
    wait_for(
        lambda: all(system.client.zcard(k.transition_outbox()) == 0
                    for k in system.keys.every_partition()),
        30,
        what="every partition's outbox empty",
    )  # fmt: skip
    system.procs.stop()

    ledgers = {
        (uid, region): system.ledger(uid, region, window_start, window_end)
        for uid in CHECKS
        for region in REGIONS
    }
    summary = "\n".join(f"{uid}@{g}: {ledger.describe()}" for (uid, g), ledger in ledgers.items())
    print(summary)
    for (uid, region), ledger in ledgers.items():
        assert len(ledger.due()) >= 6, summary
        assert ledger.twice() == [], f"{uid}@{region} probed a tick twice\n{summary}"
        assert ledger.missed() == [], f"{uid}@{region} missed a tick\n{summary}"

    for uid in CHECKS:
        moves = [(t["from"], t["to"]) for t in made(uid)]
        assert moves == ([("up", "down"), ("down", "up")] if uid in flipped else []), (uid, moves)
    made_ids = Counter(t["id"] for uid in flipped for t in made(uid))
    got = Counter(d["id"] for d in delivered(system.record))
    assert got == made_ids and set(got.values()) == {1}, (got, made_ids)
    assert system.cross_slot_lines() == []


@pytest.mark.parametrize(
    "victim",
    [1, 2],
    ids=["a-master", "the-master-of-keyless-commands"],  # node 2 owns `{checks}`' slot: TIME
)
def test_a_master_killed_mid_runs_runs_no_tick_twice_and_reports_the_ticks_lost(system, victim):
    """The victim's checks answer after PROBE_S, and the master is killed while one of their
    probes is in flight; its replica is promoted at once (TAKEOVER)."""
    cluster = system.cluster
    assert cluster.node_of_slot(key_slot(b"checks")) is cluster.nodes[2]
    on_victim = [
        uid for p, uid in enumerate(CHECKS)
        if cluster.node_of_slot(_slot_of_partition(p)) is cluster.nodes[victim]
    ]  # fmt: skip
    assert len(on_victim) == 4, on_victim
    window_start, before = system.steady_window(slow=on_victim)

    def probing() -> bool:  # a probe of the victim's in flight: a hit within PROBE_S / 2
        now = time.time()
        return any(
            now - max(system.hits(uid, region)) < PROBE_S / 2
            for uid in on_victim
            for region in REGIONS
        )

    wait_for(probing, 10, interval=0.005, what="a probe in flight")
    killed_at = time.time()
    cluster.nodes[victim].kill()
    took = cluster.promote(cluster.replicas[victim][0])
    resumed_at = time.time()
    # four periods past the promotion, and at least the six ticks of every job the account asks
    window_end = max(resumed_at + 4 * PERIOD_S, window_start + 6 * PERIOD_S)
    system.runs_again_after(window_end + PERIOD_S)
    system.procs.stop()

    _assert_failover_accounted(system, on_victim, before, window_start, window_end, killed_at, took)


def _assert_failover_accounted(
    system: System,
    on_victim: list[str],
    before: dict[tuple[str, str], int],
    window_start: float,
    window_end: float,
    killed_at: float,
    took: float,
    *,
    beats_stall: bool = False,
) -> None:
    """Per job over the window: no tick probed twice, every tick not probed reported; none
    lost on the masters that lived, at most MAX_LOST_TICKS on the killed one's.

    ``beats_stall``: a WAIT timeout about a period long, and a promoted master without a
    replica. Each beat's reaper then waits that long for its completions on that master, once
    per shortfall's skip (replication.DEGRADED_S), and every partition's dispatch waits
    behind it: every job may lose up to STALL_LOST_TICKS more, the other masters' too, each
    one reported."""
    measured = []
    for uid in CHECKS:
        for region in REGIONS:
            ledger = system.ledger(uid, region, window_start, window_end)
            reported = system.counters(uid, region) - before[(uid, region)]
            measured.append((uid, region, ledger, reported))
    summary = "\n".join(
        f"{uid}@{g}{' (on the killed master)' if uid in on_victim else ''}: "
        f"{ledger.describe()}, counters {reported}"
        for uid, g, ledger, reported in measured
    )
    lost = sum(len(ledger.missed()) for _u, _g, ledger, _r in measured)
    summary += (
        f"\nmaster killed at {killed_at:.3f}, replica promoted in {took:.2f} s; "
        f"ticks not probed in all: {lost}"
    )
    print(summary)
    for uid, region, ledger, reported in measured:
        assert len(ledger.due()) >= 6, summary
        assert ledger.twice() == [], f"{uid}@{region} probed a tick twice\n{summary}"
        assert len(ledger.unrecorded_misses()) <= reported, (
            f"{uid}@{region} lost ticks nothing reports\n{summary}"
        )
        if uid in on_victim or beats_stall:
            bound = MAX_LOST_TICKS + (STALL_LOST_TICKS if beats_stall else 0)
            assert len(ledger.missed()) <= bound, f"{uid}@{region}\n{summary}"
        else:  # the other masters' partitions run on as if nothing happened
            assert ledger.missed() == [], f"{uid}@{region} lost a tick\n{summary}"
    assert system.cross_slot_lines() == []


@pytest.mark.parametrize(
    "system",
    [{"CHECKBEAT_REDIS_WAIT_TIMEOUT": "2"}],  # the default WAIT: 1 on a master with a replica
    ids=["default-wait"],
    indirect=True,
)
def test_a_lagging_replica_promoted_runs_no_tick_twice(system):
    """The killed master's replica is stopped (SIGSTOP) and its link filled (a large value in
    one of the master's slots: the socket buffers hold part of it, the rest waits in the
    master's memory) until the master has made a claim the replica cannot have and that
    claim's run has had the time to send its start (before any WAIT sent since the stop can
    time out); then the master is killed, the replica resumed and promoted, and the writes in
    between (claims, starts, completions) are lost. A run of a lost claim must not have
    probed: its start's WAIT (on the master that took the start, a 2 s timeout here) is still
    waiting when the master dies, as under Sentinel (tests/test_failover_runs.py,
    ``replica-lagging``). Without that WAIT such a run probes at once, and its tick is claimed
    and probed again on the promoted replica."""
    cluster = system.cluster
    # node 0 owns neither the cron half (the beats' cron claims wait for their replica: a
    # stopped one would hold every beat's loop, claims included, for the WAIT's timeout) nor
    # the keyless commands
    victim = 0
    assert cluster.node_of_slot(key_slot(b"cron")) is not cluster.nodes[victim]
    parts = [p for p in range(PARTITIONS) if cluster.node_of_slot(_slot_of_partition(p))
             is cluster.nodes[victim]]  # fmt: skip
    on_victim = [CHECKS[p] for p in parts]
    window_start, before = system.steady_window(slow=on_victim)

    master = cluster.nodes[victim].client()

    def leases() -> dict[str, str]:  # job -> its lease token, read on the master itself
        jobs = [job_id(uid, g) for uid in on_victim for g in REGIONS]
        tokens = {j: master.hget(system.keys.job(j), JobField.LEASE_TOKEN) for j in jobs}
        return {j: t for j, t in tokens.items() if t}

    replica = cluster.replicas[victim][0]
    replica.process.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        filler = f"{system.settings.key_prefix}:{partition_tags(PARTITIONS)[parts[0]]}:filler"
        master.set(filler, b"x" * LINK_FILLER_BYTES)
        replicated = set(leases().values())
        unreplicated: dict[str, float] = {}  # job -> when its lost claim was seen

        def lost_claim_started() -> bool:
            for job, token in leases().items():
                if token not in replicated:
                    unreplicated.setdefault(job, time.time())
            if time.monotonic() - stopped > 1.8:  # WAITs sent since the stop answer from 2 s
                return True
            return bool(unreplicated) and (
                time.time() - min(unreplicated.values()) > 0.3  # its run has sent its start
                or any(
                    max(system.hits(*job.split("@"))) > seen for job, seen in unreplicated.items()
                )
            )

        wait_for(lost_claim_started, 6, interval=0.005, what="a lost claim")
        killed_at = time.time()
        cluster.nodes[victim].kill()
    finally:
        replica.process.send_signal(signal.SIGCONT)
        master.close()
    assert unreplicated, "no claim the replica lacked when its master died"
    took = cluster.promote(replica)
    window_end = max(time.time() + 4 * PERIOD_S, window_start + 6 * PERIOD_S)
    system.runs_again_after(window_end + PERIOD_S)
    system.procs.stop()
    _assert_failover_accounted(
        system, on_victim, before, window_start, window_end, killed_at, took, beats_stall=True
    )
