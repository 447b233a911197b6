"""A real Prometheus server for the metrics tests: Debian's ``prometheus`` binary on loopback.

Started by the test itself (no systemd): a generated config scraping the given targets every
second, a temporary storage directory and an ephemeral port; queried through its HTTP API.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.polling import wait_for

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NAME = re.compile(r"\bcheckbeat_[a-z0-9_]+")


@dataclass
class ScrapeJob:
    name: str
    targets: list[str]
    path: str = "/metrics"
    params: dict[str, list[str]] = field(default_factory=dict)


def metric_names(text: str) -> set[str]:
    """Every ``checkbeat_*`` name an expression (or a file of them) mentions."""
    return set(NAME.findall(text))


class Prometheus:
    def __init__(self, workdir: Path, port: int, jobs: list[ScrapeJob], rules: Path) -> None:
        assert PROMETHEUS is not None
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": job.name,
                    "metrics_path": job.path,
                    "params": job.params,
                    "static_configs": [{"targets": job.targets}],
                }
                for job in jobs
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._ready, 30, what="Prometheus to be ready")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def value(self, expr: str) -> float | None:
        """The value of an instant query that yields one sample (None: no sample)."""
        result = self.api("query", query=expr)["result"]
        return float(result[0]["value"][1]) if result else None

    def names(self) -> set[str]:
        return set(self.api("label/__name__/values"))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()
