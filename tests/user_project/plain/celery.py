"""The one line checkbeat needs for cron tasks: ``beat_scheduler``."""

import os

from celery import Celery

app = Celery("plain", broker=os.environ["PROJ_BROKER_URL"])
app.conf.imports = ["plain.tasks"]
app.conf.beat_scheduler = "beat:CronScheduler"
app.conf.checkbeat_key_prefix = os.environ["PROJ_KEY_PREFIX"]
