"""What ``schedule diagnose`` and ``checks diagnose`` report: one :class:`Finding` per problem.

A finding is data (what kind of problem, about what, since when) with the line an operator
reads; the CLI prints ``message`` as text or, with ``--json``, every field of each finding as one
JSON list (:func:`findings_json`, the same for both commands), and code and tests decide on
``kind`` and ``subject``, never on the wording. Here, below ``cron_tasks`` and ``checks``,
because both report them and neither imports the other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class FindingKind(StrEnum):
    """Every kind of finding; its subject is named after each."""

    # schedule diagnose
    NO_LIVE_BEAT = "no_live_beat"  # subject: the last beat's id, or "beat" when none was seen
    NO_TENANTS_PROVIDER = "no_tenants_provider"  # subject: the per-tenant task
    TENANTS_PROVIDER_FAILS = "tenants_provider_fails"  # subject: the provider
    OVERDUE = "overdue"  # subject: the task; since: the window that passed
    FAILING = "failing"  # subject: task (|tenant) whose last run failed
    UNCONFIRMED = "unconfirmed"  # a claimed window never confirmed as published
    NOT_FIRED = "not_fired"  # recorded windows that could not fire; since: the first
    SKIPPED = "skipped"  # a window skipped because the previous run was in flight
    NEVER_STARTED = "never_started"  # a fired window no worker started by its deadline
    # checks diagnose
    NO_LIVE_WORKER = "no_live_worker"  # subject: the region
    NO_SHARED_WORKER = "no_shared_worker"  # subject: the region
    PARTITION_WITHOUT_SLOTS = "partition_without_slots"  # subject: the region
    QUARANTINED = "quarantined"  # subject: the job id; since: when it was quarantined


@dataclass(frozen=True)
class Finding:
    """One problem: ``subject`` is what it is about (a task id, ``task|tenant`` for a tenant's
    run, a region, a job id), ``message`` the line the CLI prints, ``since`` when it began where
    that is known."""

    kind: FindingKind
    subject: str
    message: str
    since: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        """The finding as ``--json`` prints it (``since`` in ISO 8601, null when unknown)."""
        since = None if self.since is None else self.since.isoformat(timespec="seconds")
        return {
            "kind": str(self.kind),
            "subject": self.subject,
            "message": self.message,
            "since": since,
        }


def findings_json(findings: Iterable[Finding]) -> str:
    """What both ``diagnose --json`` print: a JSON list of :meth:`Finding.as_json`, ``[]`` when
    nothing is wrong."""
    return json.dumps([finding.as_json() for finding in findings], indent=2)
