"""The post-exec write's read round trip also carries the refill's reads.

Why: after every run the worker refills the slot it freed, and the refill's first round trip
(server time, first due job, ready or held work in the region) found nothing most of the time
under spare capacity; it was a tenth of a run's worker CPU. Queued on the write's own read
(``finish_run_with_health``'s prefetch hook), it costs no round trip of its own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery_app.checks.check_state import HealthPlanner, HealthUpdate
from celery_app.checks.dispatch import RefillNeeds
from celery_app.checks.jobs import JobState


class HealthWithRefillNeeds:
    """``health_of`` for ``finish_run_with_health``: the planner, and the refill's reads
    queued first on the same pipeline (their replies come first)."""

    def __init__(self, planner: HealthPlanner, needs: RefillNeeds) -> None:
        self.planner, self.needs = planner, needs

    def prefetch(self, pipe: Any) -> None:
        self.needs.prefetch(pipe)
        self.planner.prefetch(pipe)

    def prefetched(self, replies: list[Any]) -> None:
        self.needs.prefetched(replies)
        self.planner.prefetched(replies[RefillNeeds.READS :])

    def __call__(self, job: JobState, now: datetime) -> HealthUpdate:
        return self.planner(job, now)
