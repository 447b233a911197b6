"""``celery worker --role fast|shared --region R``: the options checkbeat adds to the worker.

Why here: click options must exist when the ``celery`` command parses its arguments, i.e. when
``celery_app`` is imported; the bootstep that acts on them lives in ``workers`` and is named by an
import string, so ``celery_app`` never imports ``workers``.
"""

from __future__ import annotations

import click
from celery import Celery

WORKER_STEP = "workers.worker_step:CheckWorkerStep"
METRICS_STEP = "workers.metrics_step:MetricsStep"


def install_worker_options(app: Celery) -> None:
    """Add ``--role``/``--region`` to ``celery worker`` and the capacity bootstep to the app."""
    app.user_options["worker"].add(
        click.Option(
            ["--role", "checkbeat_role"],
            type=click.Choice(["fast", "shared"]),
            default=None,
            help=(
                "checkbeat lane role: 'fast' consumes checks.<region>.fast with "
                "CHECKBEAT_FAST_LANE_RESERVED slots; 'shared' consumes both lanes with "
                "CHECKBEAT_POOL_SIZE - CHECKBEAT_FAST_LANE_RESERVED slots. Use -P threads."
            ),
        )
    )
    app.user_options["worker"].add(
        click.Option(
            ["--region", "checkbeat_region"],
            default=None,
            help="Region of the --role worker (default: the first of CHECKBEAT_REGIONS).",
        )
    )
    app.steps["worker"].add(WORKER_STEP)
    app.steps["worker"].add(METRICS_STEP)
