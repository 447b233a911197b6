"""Operations on plain Celery workers: a project adopts checkbeat by ``beat_scheduler`` alone and
its workers never load checkbeat's recording (``opsproj``: no checkbeat import in its app or its
``imports``). Two real beats (``celery -A opsproj beat``) and a real plain worker (``celery -A
opsproj worker``) run on the real clock; every task body INCRs a Redis counter keyed by (label,
window), so a window fired twice, or one that should have run and did not, shows.

What the operator commands must then do: ``schedule add`` fires every window (``overlap``
defaults to ``allow`` and says why, ``skip`` warns); ``schedule pause|resume`` of a
``beat_schedule`` entry is seen by both beats within a tick; ``schedule run --force`` runs now
although the window fired; ``run --wait`` returns with the result backend's outcome, or at once
with exit 3 when nothing can tell; ``list`` and ``diagnose`` say "not recorded", never "lost";
the beat banner counts the tasks the log then loads; a clean stop is named by diagnose.
"""

from __future__ import annotations

import json
import re
import textwrap
import time
import uuid
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from support.polling import wait_for
from support.projects import UserProject, stop

from celery_app.redis.schema import Keys

ROOT = Path(__file__).resolve().parents[1]
PROJECT_DB = 7  # a db of the session's server no other test uses
EVERY = timedelta(seconds=2)
COUNTS = "opsproj:counts"

CELERY_PY = """
import os
from datetime import timedelta

from celery import Celery

app = Celery("opsproj", broker=os.environ["PROJ_BROKER_URL"])
app.conf.imports = ["opsproj.tasks"]
if not os.environ.get("PROJ_NO_BACKEND"):
    app.conf.result_backend = os.environ["PROJ_BROKER_URL"]
app.conf.beat_scheduler = "beat:CronScheduler"
app.conf.checkbeat_key_prefix = os.environ["PROJ_KEY_PREFIX"]
app.conf.checkbeat_cron_grace = 2
app.conf.beat_schedule = {
    "tick-2s": {
        "task": "opsproj.tasks.count", "schedule": timedelta(seconds=2), "args": ("tick",),
    },
}
"""

TASKS_PY = """
import os

import redis

from opsproj.celery import app

_counts = redis.Redis.from_url(os.environ["PROJ_BROKER_URL"])


@app.task(bind=True, name="opsproj.tasks.count")
def count(self, label):
    _counts.hincrby("opsproj:counts", f"{label}|{getattr(self.request, 'cron_window', None)}", 1)
    return label
"""


@pytest.fixture
def project(tmp_path: Path, redis_server):
    client = redis.Redis.from_url(redis_server.url(PROJECT_DB), decode_responses=True)
    client.flushdb()
    package = tmp_path / "opsproj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "celery.py").write_text(textwrap.dedent(CELERY_PY))
    (package / "tasks.py").write_text(textwrap.dedent(TASKS_PY))
    url = redis_server.url(PROJECT_DB)
    built = UserProject(tmp_path, url, f"ops{uuid.uuid4().hex[:8]}", app="opsproj")
    built.pythonpath = lambda: [str(tmp_path), str(ROOT)]  # checkbeat from the repository
    built.db = client
    yield built
    built.stop_all()
    client.close()


def _windows(counts: dict[str, str], label: str) -> dict[datetime, int]:
    """Scheduled windows of ``label`` (forced run-now ids, to the microsecond, left out)."""
    found = {}
    for key, n in counts.items():
        name, _, wid = key.partition("|")
        if name == label and "." not in wid:
            found[datetime.fromisoformat(wid)] = int(n)
    return found


def _forced(counts: dict[str, str], label: str) -> dict[str, int]:
    return {k: int(n) for k, n in counts.items() if k.startswith(f"{label}|") and "." in k}


def _contiguous(starts: list[datetime]) -> bool:
    return all(b - a == EVERY for a, b in pairwise(sorted(starts)))


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.mark.slow
def test_runtime_schedules_pause_run_now_and_diagnose_on_plain_workers(project):
    keys = Keys(project.prefix)
    worker = project.start("worker", "-P", "solo", "--without-mingle", "-l", "INFO")
    beats = [
        project.start("beat", "--pidfile=", "-l", "INFO", "-s", str(project.root / f"b{i}"))
        for i in (0, 1)
    ]
    wait_for(lambda: "ready" in project.logs(), timeout=60, what="the worker is ready")
    wait_for(
        lambda: len(re.findall(r"cron: \d+ tasks", project.logs())) >= 2,
        timeout=60,
        what="both beats set up",
    )

    # --- add: overlap allow by default on plain workers, and a warning for skip --------------
    added = project.celery(
        "schedule", "add", "rt", "--task", "opsproj.tasks.count", "--every", "2s",
        "--args", '["rt"]',
    )  # fmt: skip
    added_at = _now()
    assert added.returncode == 0, added.stderr
    assert "overlap=allow, as no live worker records cron runs" in added.stderr
    assert "celery_app.cron_tasks.recording" in added.stderr
    skip = project.celery(
        "schedule", "add", "rt-skip", "--task", "opsproj.tasks.count", "--every", "2s",
        "--timeout", "1s", "--overlap", "skip", "--args", '["skip"]',
    )  # fmt: skip
    assert skip.returncode == 0, skip.stderr
    assert "warning: overlap=skip needs workers that record cron runs" in skip.stderr
    assert len(skip.stderr.strip().splitlines()) == 1, skip.stderr

    wait_for(
        lambda: len(_windows(project.db.hgetall(COUNTS), "rt")) >= 3,
        timeout=30,
        what=lambda: f"three windows of rt ran\n{project.logs()}",
    )

    # --- pause a beat_schedule entry: both beats drop it within a tick ------------------------
    paused = project.celery("schedule", "pause", "tick-2s")
    paused_at = _now()
    assert paused.returncode == 0, paused.stderr
    assert "paused beat_schedule entry 'tick-2s'" in paused.stdout

    listed = project.celery("schedule", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert rows["tick-2s"]["paused"] is True
    assert rows["tick-2s"]["timeout_s"] is None  # a beat_schedule entry gets no limit here
    assert rows["rt"]["timeout_s"] == 300 and rows["rt"]["overlap"] == "allow"
    assert rows["rt"]["runs_recorded"] is False
    assert re.search(r"T\d\d:\d\d:\d\d", rows["rt"]["next_fire"]), rows["rt"]  # seconds
    table = project.celery("schedule", "list").stdout
    line = next(x for x in table.splitlines() if x.startswith("rt "))
    assert re.search(r"not recorded\s+not recorded$", line.rstrip()), table
    tick_line = next(x for x in table.splitlines() if x.startswith("tick-2s "))
    assert " paused " in tick_line and " - " in tick_line, table

    # --- run now: refused in a fired window unless forced; --wait always returns --------------
    refused = project.celery("schedule", "run", "rt")
    if refused.returncode != 0:  # the window had fired (else the run took it: also fine)
        assert refused.returncode == 1 and "--force" in refused.stdout, refused.stdout
    started = time.monotonic()
    forced = project.celery("schedule", "run", "rt", "--force", "--wait", "--timeout", "30")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "as a forced run" in forced.stdout
    assert "outcome: success (from the result backend)" in forced.stdout
    assert time.monotonic() - started < 30
    started = time.monotonic()
    blind = project.celery(
        "schedule", "run", "rt", "--force", "--wait", "--timeout", "120", PROJ_NO_BACKEND="1"
    )
    assert blind.returncode == 3, blind.stdout + blind.stderr
    assert "outcome: unknown" in blind.stdout and "cannot be known" in blind.stdout
    assert time.monotonic() - started < 60  # once no recording worker showed up, not at 120 s

    wait_for(lambda: _now() > paused_at + timedelta(seconds=12), timeout=30)
    resumed = project.celery("schedule", "resume", "tick-2s")
    resumed_at = _now()
    assert resumed.returncode == 0 and "resumed beat_schedule entry" in resumed.stdout
    wait_for(lambda: _now() > resumed_at + timedelta(seconds=8), timeout=30)
    for beat in beats:
        stop(beat)
    stopped_at = _now()
    wait_for(
        lambda: project.db.llen("celery") == 0,
        timeout=30,
        what=lambda: f"the worker drained the queue\n{project.logs()}",
    )
    stop(worker)

    counts = project.db.hgetall(COUNTS)
    assert {k: n for k, n in counts.items() if n != "1"} == {}, project.logs()  # no doubles
    assert "rt|None" not in counts and "tick|None" not in counts
    # every window of rt from its first to the stop ran, once (allow: none skipped)
    rt = sorted(_windows(counts, "rt"))
    assert rt[0] <= added_at + 2 * EVERY, (added_at, rt)
    assert rt[-1] >= stopped_at - 3 * EVERY, (stopped_at, rt)
    assert _contiguous(rt), rt
    assert len(_forced(counts, "rt")) == 2, counts  # both forced runs ran, once each
    # tick-2s: every window up to the pause, none from one tick after it until the resume's
    # grace, then every window again
    tick = sorted(_windows(counts, "tick"))
    before = [w for w in tick if w <= paused_at + EVERY]
    after = [w for w in tick if w >= resumed_at - 2 * EVERY]
    assert len(before) + len(after) == len(tick), (paused_at, resumed_at, tick)
    assert _contiguous(before) and _contiguous(after), tick
    assert len(before) >= 3 and after[0] <= resumed_at + 2 * EVERY, (resumed_at, tick)
    assert after[-1] >= stopped_at - 3 * EVERY, (stopped_at, tick)

    # rt-skip: nothing records its runs' ends, so each fired window holds the next ones until
    # its in-flight mark expires (the window's deadline plus the hard limit): skipped, recorded,
    # and never blocked for longer than that
    fired = sorted(_windows(counts, "skip"))
    assert len(fired) >= 3, (fired, project.logs())
    hold = EVERY + timedelta(seconds=2) + timedelta(seconds=1 + 5)  # window, grace, hard limit
    assert all(b - a <= hold + EVERY for a, b in pairwise(fired)), fired
    skipped = int(project.db.hget(keys.cron_state("rt-skip", "-"), "skipped") or 0)
    assert skipped >= len(fired) - 1, (skipped, fired)
    # the worker was plain: it never said it records, and nothing was recorded
    assert project.db.hlen(keys.cron_recorders()) == 0
    assert not project.db.hget(keys.cron_state("rt", "-"), "last_start")
    # the banner counted what the log then loaded (runtime rt, tick-2s, backend_cleanup)
    for log in sorted(project.root.glob("beat-*.log")):
        text = log.read_text()
        banner = re.search(r"cron tasks -> (\d+)", text)
        loaded = re.search(r"cron: (\d+) tasks", text)
        assert banner and loaded and banner.group(1) == loaded.group(1), text[-3000:]

    # after the windows' deadlines: not recorded, never "lost"; the clean stop is named
    wait_for(lambda: _now() > stopped_at + timedelta(seconds=5), timeout=10)
    diagnosed = project.celery("schedule", "diagnose")
    out = diagnosed.stdout
    assert "stopped at" in out and "never recorded" not in out, out
    assert "its run is not recorded (workers do not run checkbeat's recording)" in out, out
    assert "task 'rt-skip': window" in out and "the previous run's end is not recorded" in out
    assert "never received" not in out and "lost" not in out, out
