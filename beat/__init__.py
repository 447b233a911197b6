"""checkbeat's beat: the cron engine and the periodic drivers, run by ``CronScheduler``.

The app config selects it with ``beat_scheduler="beat:CronScheduler"``.
"""

from beat.scheduler import CronScheduler

__all__ = ["CronScheduler"]
