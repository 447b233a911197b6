"""`checkbeat up` end to end: the whole system as separate processes, the way it is deployed.

Each test starts `checkbeat up --demo --no-view` in its own data directory with its own embedded
redis-server (CHECKBEAT_REDIS_URL unset), then reads the state through `checkbeat status --json`,
the same way an operator would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.polling import wait_for

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKBEAT_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _up(data_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery_app.cli.main",
            "up",
            "--demo",
            "--no-view",
            "--data-dir",
            str(data_dir),
            "--flower-port",
            "0",
        ],
        cwd=data_dir.parent,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _status(data_dir: Path) -> dict | None:
    if not (data_dir / "env.json").exists():
        return None
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_app.cli.main",
            "status",
            "--json",
            "--data-dir",
            str(data_dir),
        ],
        cwd=data_dir.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        return None
    return json.loads(done.stdout)


def _child_pids(data_dir: Path) -> set[int]:
    """Every process whose command line mentions the data dir or runs our celery app."""
    pids = set()
    env_file = data_dir / "env.json"
    marker = json.loads(env_file.read_text())["CHECKBEAT_REDIS_URL"] if env_file.exists() else ""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        port = marker.rsplit(":", 1)[-1].split("/")[0] if marker else None
        if (
            (marker and marker.encode() in environ)
            or (port and b"redis-server" in cmdline and f":{port}".encode() in cmdline)
            or str(data_dir).encode() in cmdline
        ):
            pids.add(int(proc.name))
    pids.discard(os.getpid())
    return pids


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


def test_up_demo_runs_checks_learns_lanes_fires_cron_and_stops_cleanly(tmp_path):
    data_dir = tmp_path / "cb"
    proc = _up(data_dir)
    try:

        def settled():
            status = _status(data_dir)
            if not status:
                return None
            checks = status["checks"]
            fast_up = [c for c in checks if c["uid"].endswith("-home") and c["last_status"] == "up"]
            slow = [c for c in checks if c["uid"].endswith("-report") and c["lane"] == "slow"]
            cron = {r["id"]: r for r in status["cron"]}
            tenants = cron.get("demo.tenant_report", {}).get("tenants") or {}
            fired_both = {"acme", "globex"} <= {
                t for t, s in tenants.items() if s.get("last_outcome") == "success"
            }
            # beat and five workers serve metrics; lateness is read from the workers' histograms
            served = len(status["metrics"]) == 6
            late = (status["lateness"].get("eu/fast") or {}).get("runs", 0) > 0
            # /flapping's outages move its checks through the thresholds: a transition shows
            flapped = [t for t in status["transitions"] if t["uid"].endswith("-flapping")]
            done = len(fast_up) >= 2 and slow and fired_both and served and late and flapped
            return status if done else None

        status = wait_for(settled, timeout=150, interval=1.0, what="demo to settle")
        assert {lane["region"] for lane in status["lanes"]} == {"eu", "us"}
        roles = sorted(m["role"] for m in status["metrics"])
        assert roles == ["beat", *["worker"] * 5]
        for endpoint in status["metrics"]:
            with urllib.request.urlopen(endpoint["healthz"], timeout=5) as reply:
                assert reply.status == 200, endpoint
        assert status["lateness"]["eu/fast"]["p50"] is not None
        assert status["lateness"]["eu/fast"]["p99"] >= status["lateness"]["eu/fast"]["p50"]
        assert {s["uid"] for s in status["states"]} >= {"acme-flapping", "globex-flapping"}
        hook_log = data_dir / "logs" / "worker-tasks.log"
        wait_for(
            lambda: "checkbeat demo transition: " in hook_log.read_text(errors="replace"),
            30,
            what="the demo hook to print a transition",
        )
        pids = _child_pids(data_dir)
        assert len(pids) >= 7  # redis, beat, 5 workers (+ flower when installed)

        proc.send_signal(signal.SIGINT)
        code, out = _stop_when_done(proc)
        assert code == 0, out
        assert "stopping beat" in out
        beat_url = next(m["url"] for m in status["metrics"] if m["role"] == "beat")
        assert f"metrics: beat {beat_url}/metrics" in out
        assert out.index("stopping beat") < out.index("stopping worker")
        survivors = {p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)}
        assert not survivors, f"left behind: {survivors}\n{out}"
    finally:
        _stop(proc)


def _zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]) == "Z"
    except OSError:
        return True


def _stop_when_done(proc: subprocess.Popen[str], timeout: float = 90) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_a_dead_worker_is_reported_and_up_exits_non_zero(tmp_path):
    data_dir = tmp_path / "cb"
    proc = _up(data_dir)
    try:

        def worker_pid() -> int | None:
            for pid in _child_pids(data_dir):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"--role" in cmd and b"fast" in cmd and b"eu" in cmd:
                    return pid
            return None

        pid = wait_for(worker_pid, timeout=60, interval=0.5, what="the eu fast worker")
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        code, out = _stop_when_done(proc)
        assert code != 0
        assert "worker-eu-fast" in out and "exited" in out, out
        assert time.monotonic() - started < 90
    finally:
        _stop(proc)
