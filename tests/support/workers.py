"""Helpers of the worker tests: worker subprocesses, claiming a job by hand, a dispatcher thread.

Their fixtures (``start_worker_process``, ``claim``, ``dispatching``, ...) are in
``worker_fixtures``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.background import Background

REPO = Path(__file__).resolve().parents[2]


def worker_env(**extra: str) -> dict[str, str]:
    """The test environment (Redis URLs, key prefix) plus ``extra``, with the repo importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


class WorkerProcess:
    """One ``celery -A celery_app worker`` subprocess; stop() is a warm shutdown (SIGTERM)."""

    def __init__(self, args: list[str], log: Path, **env: str) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", *args],
            cwd=REPO,
            env=worker_env(**env),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        self._log_file.close()
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log_file.close()


def claim_by_hand(client, keys, job_id: str, token: str, lease_s: float = 60.0) -> dict:
    """Take a job's lease as the dispatcher's claim does (test data for single-run tests):
    returns the run_check kwargs for it."""
    from celery_app.checks.jobs import read_job
    from celery_app.redis.clock import server_time
    from celery_app.redis.schema import JobField, split_job_id

    keys = keys.of_job(job_id)  # its lease and indexes are its check's partition's
    job = read_job(client, keys, job_id)
    assert job is not None, job_id
    _uid, region = split_job_id(job_id)
    expiry = time.time() + lease_s
    # The dispatcher claims a job only once it is due (at most the dispatch lead ahead, and the
    # worker waits for the tick): a job whose first tick is still to come is made due now.
    scheduled_at = min(job.scheduled_at, server_time(client))
    pipe = client.pipeline(transaction=True)
    pipe.hset(
        keys.job(job_id),
        mapping={
            JobField.LEASE_TOKEN: token,
            JobField.LEASE_EXPIRY: f"{expiry:.3f}",
            JobField.SCHEDULED_AT: repr(scheduled_at),
        },
    )
    pipe.zadd(keys.leases(region, job.lane), {job_id: expiry})
    pipe.zrem(keys.due(), job_id)
    pipe.zrem(keys.ready(region, job.lane), job_id)
    pipe.execute()
    return {
        "job_id": job_id,
        "lease_token": token,
        "scheduled_at": scheduled_at,
        "effective_scheduled_at": job.effective_scheduled_at,
        "timeout_s": 5.0,
    }


class Ticker(Background):
    """Runs ``Dispatcher.tick()`` of each of ``dispatchers`` (one per partition of the check
    half, as beat runs them: ``support.partitions.dispatchers``) every ``interval`` seconds in a
    thread (beat's job), with pause/resume so a test can make starts late. Errors surface at
    stop()."""

    def __init__(self, dispatchers, interval: float = 0.1) -> None:
        super().__init__("test-dispatcher")
        self.dispatchers = list(dispatchers)
        self.interval = interval
        self.ticks = 0
        self._running = threading.Event()
        self._running.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self._running.is_set():
                continue
            for dispatcher in self.dispatchers:
                dispatcher.tick()
            self.ticks += 1

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()
