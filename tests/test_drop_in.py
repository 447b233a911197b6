"""The drop-in issue, end to end: a Celery project of the user's own (``proj``, its own package
and app, written to a tmp dir) switches to ``beat:CronScheduler`` and keeps every schedule.

Its ``beat_schedule`` crontab, 20 s interval and ``relative`` 30 s entries, an
``add_periodic_task`` call, a ``@cron`` task and a runtime ``schedule add`` are fired by two real
beats into a real worker over more than two windows of each; every task body INCRs a Redis
counter keyed by (label, window), so a window fired twice or a gap shows. ``schedule rm`` stops
the runtime entry within one tick. The clock is the test clock (``CHECKBEAT_TEST_CLOCK``) at 4x:
2.5 simulated minutes in ~40 s.
"""

from __future__ import annotations

import textwrap
import time
import uuid
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from support.cron import T0
from support.polling import wait_for
from support.projects import UserProject, stop

from celery_app.wall_clock import TEST_CLOCK_ENV, Clock

ROOT = Path(__file__).resolve().parents[1]
PROJECT_DB = 6  # a db of the session's server no other test uses
RATE = 4.0
COUNTS = "proj:counts"

CELERY_PY = """
import os
from itertools import pairwise
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

app = Celery("proj", broker=os.environ["PROJ_BROKER_URL"])
app.conf.imports = ["proj.tasks"]
app.conf.beat_scheduler = "beat:CronScheduler"
app.conf.checkbeat_key_prefix = os.environ["PROJ_KEY_PREFIX"]
app.conf.beat_schedule = {
    "report-minutely": {
        "task": "proj.tasks.count", "schedule": crontab(), "args": ("report",),
    },
    "ping-20s": {
        "task": "proj.tasks.count", "schedule": timedelta(seconds=20), "args": ("ping",),
    },
    "rel-30s": {  # no fixed grid: asked is_due with the last run both beats share
        "task": "proj.tasks.count", "schedule": timedelta(seconds=30), "relative": True,
        "args": ("relative",),
    },
}
if os.environ.get("PROJ_BROKEN"):  # three entries Celery's beat could not run either
    app.conf.beat_schedule["as-text"] = {"task": "proj.tasks.count", "schedule": "*/5 * * * *"}
    app.conf.beat_schedule["an-object"] = {"task": "proj.tasks.count", "schedule": object()}
    app.conf.beat_schedule["no-task"] = {"schedule": 10}


@app.on_after_configure.connect
def periodic(sender, **_):
    sender.add_periodic_task(30.0, sender.signature("proj.tasks.count", ("periodic",)))
"""

TASKS_PY = """
import os
from itertools import pairwise

import redis

from celery_app import cron
from proj.celery import app

_counts = redis.Redis.from_url(os.environ["PROJ_BROKER_URL"])


def _count(request, label):
    _counts.hincrby("proj:counts", f"{label}|{getattr(request, 'cron_window', None)}", 1)


@app.task(bind=True, name="proj.tasks.count")
def count(self, label):
    _count(self.request, label)


@cron("* * * * *", id="cron-minutely", app=app, bind=True)
def cron_minutely(self):
    _count(self.request, "cron")
"""


class Project(UserProject):
    """``proj`` written to ``root``, on the test clock at ``RATE`` (checkbeat importable from the
    repository, as the project has no installed copy of its own)."""

    def __init__(self, root: Path, broker_url: str) -> None:
        super().__init__(root, broker_url, f"dropin{uuid.uuid4().hex[:8]}")
        package = root / "proj"
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "celery.py").write_text(textwrap.dedent(CELERY_PY))
        (package / "tasks.py").write_text(textwrap.dedent(TASKS_PY))
        self.clock = Clock(start=T0 - timedelta(seconds=5), epoch=time.time(), rate=RATE)

    def pythonpath(self) -> list[str]:
        return [str(self.root), str(ROOT)]

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(**{TEST_CLOCK_ENV: self.clock.encode()}, **extra)

    def logs(self) -> str:
        return super().logs(tail=4000)

    def wait_until(self, simulated: datetime) -> None:
        wait_for(
            lambda: self.clock.now() >= simulated,
            timeout=self.clock.real_seconds((simulated - self.clock.now()).total_seconds()) + 5,
            what=f"simulated {simulated}",
        )


@pytest.fixture
def project(tmp_path: Path, redis_server):
    client = redis.Redis.from_url(redis_server.url(PROJECT_DB), decode_responses=True)
    client.flushdb()
    built = Project(tmp_path, redis_server.url(PROJECT_DB))
    built.db = client
    yield built
    for process in built.processes:
        if process.poll() is None:
            stop(process)
    client.close()


def _windows(counts: dict[str, str], label: str) -> dict[str, int]:
    return {
        key.split("|", 1)[1]: int(n) for key, n in counts.items() if key.split("|", 1)[0] == label
    }


def _start_of(window_id: str) -> datetime:
    return datetime.fromisoformat(window_id)


def _contiguous(windows: dict[str, int], every: timedelta) -> bool:
    starts = sorted(_start_of(w) for w in windows)
    return all(b - a == every for a, b in pairwise(starts))


@pytest.mark.slow  # about 40 s of real processes: in CI's slow run
def test_every_source_fires_exactly_once_per_window_across_two_beats(project):
    worker = project.start("worker", "-P", "solo", "--without-mingle", "-l", "INFO")
    beats = [project.start("beat", "--pidfile=", "-s", str(project.root / f"b{i}")) for i in (0, 1)]
    project.wait_until(T0 + timedelta(seconds=10))
    added = project.celery(
        "schedule", "add", "rt-15s", "--task", "proj.tasks.count", "--every", "15s",
        "--args", '["runtime"]',
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = project.celery("schedule", "list")
    assert listed.returncode == 0, listed.stderr
    sources = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
    assert sources["report-minutely"] == sources["ping-20s"] == "beat_schedule"
    assert sources["cron-minutely"] == "@cron" and sources["rt-15s"] == "runtime"
    project.wait_until(T0 + timedelta(seconds=100))
    removed = project.celery("schedule", "rm", "rt-15s")
    assert removed.returncode == 0, removed.stderr
    removed_at = project.clock.now()
    project.wait_until(T0 + timedelta(seconds=150))
    for beat in beats:
        stop(beat)
    wait_for(
        lambda: project.db.llen("celery") == 0,
        timeout=30,
        what=lambda: f"the worker drained the queue\n{project.logs()}",
    )
    stop(worker)  # a warm shutdown: the task in hand finishes (and counts) first
    counts = project.db.hgetall(COUNTS)
    assert counts, project.logs()
    assert {k: n for k, n in counts.items() if n != "1"} == {}, project.logs()
    minute, every = timedelta(minutes=1), timedelta
    expectations = {
        "report": minute,
        "cron": minute,
        "ping": every(seconds=20),
        "periodic": every(seconds=30),
        "runtime": every(seconds=15),
    }
    for label, length in expectations.items():
        windows = _windows(counts, label)
        assert "None" not in windows, (label, windows)  # every run carried its window
        assert _contiguous(windows, length), (label, sorted(windows))
        assert len(windows) >= 2, (label, sorted(windows), project.logs())
    assert len(_windows(counts, "report")) >= 2 and len(_windows(counts, "ping")) >= 6
    # a window per shared last run, each run once: 30 s (to the second) after the one before
    relative = sorted(_start_of(w) for w in _windows(counts, "relative"))
    assert len(relative) >= 3, (relative, project.logs())
    gaps = [b - a for a, b in pairwise(relative)]
    assert all(every(seconds=29) <= gap < every(seconds=33) for gap in gaps), gaps
    # removed within one tick: no runtime window starting a whole window after the rm
    late = [w for w in _windows(counts, "runtime") if _start_of(w) > removed_at + every(seconds=15)]
    assert late == [], late


BROKEN = ("as-text", "an-object", "no-task")


def test_broken_entries_are_all_named_one_line_each_by_beat_and_the_cli(project):
    beat = project.celery("beat", "--pidfile=", PROJ_BROKEN="1")
    output = beat.stdout + beat.stderr
    assert beat.returncode == 2, output
    assert "Traceback" not in output, output
    named = [line for line in output.splitlines() if "beat_schedule entry" in line]
    assert [next(e for e in BROKEN if f"entry '{e}'" in line) for line in named] == list(BROKEN)
    commands = (
        ("schedule", "list"), ("schedule", "diagnose"), ("schedule", "run", "x"),
        ("schedule", "add", "y", "--task", "proj.tasks.count", "--every", "20s"),
        ("schedule", "pause", "ping-20s"), ("schedule", "resume", "ping-20s"),
    )  # fmt: skip
    for command in commands:
        result = project.celery(*command, PROJ_BROKEN="1")
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == len(BROKEN), lines
        for line, entry in zip(lines, BROKEN, strict=True):
            assert f"beat_schedule entry '{entry}'" in line, lines
