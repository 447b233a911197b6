"""The checkbeat app of ``bench.broker_bench``'s workers with task events off.

checkbeat's ready-made app (``celery -A celery_app``) turns task events on; a deployment that
does not want them sets ``worker_send_task_events = False`` in its own app, as this one does.
Everything else is the ready-made app's, built from the ``CHECKBEAT_*`` environment.
"""

from __future__ import annotations

from celery_app.factory import create_app

app = create_app()
app.conf.worker_send_task_events = False
