"""checkbeat's beat: the cron engine and the periodic drivers, run by ``CronScheduler``.

The app config selects it with ``beat_scheduler="beat:CronScheduler"``.
"""


def _refuse_foreign_celery_app() -> None:
    """Celery imports this package by name for ``beat:CronScheduler``; everything in it imports
    checkbeat's ``celery_app``. A project's own ``celery_app`` module first on sys.path (with
    ``python -m celery`` or ``PYTHONPATH=.``) would make that fail naming neither module, so it
    is named here, before anything imports it (``celery_app.shadowing`` cannot: it is what is
    shadowed). Under Celery's command line: one line and exit 2, as the other clashes."""
    import importlib.util
    import sys
    from pathlib import Path

    ours = Path(__file__).resolve().parents[1] / "celery_app" / "__init__.py"
    module = sys.modules.get("celery_app")
    if module is not None:
        where = getattr(module, "__file__", None)
    else:
        spec = importlib.util.find_spec("celery_app")
        where = spec.origin if spec is not None and spec.has_location else None
    if where is None or Path(where).resolve() == ours:
        return
    shown = Path(where).parent if Path(where).name == "__init__.py" else Path(where)
    message = (
        f"{shown} shadows checkbeat's package 'celery_app' ({ours.parent}/): `import celery_app` "
        "loads yours, so checkbeat cannot start; rename your 'celery_app' (checkbeat's top-level "
        "packages are celery_app, beat, workers, scheduling_core) and import it by the new name, "
        "or take its directory off sys.path (PYTHONPATH)"
    )
    if "celery.bin.celery" in sys.modules:
        print(f"Error: {message}", file=sys.stderr)
        raise SystemExit(2)
    raise ImportError(message)


_refuse_foreign_celery_app()

from beat.scheduler import CronScheduler  # noqa: E402

__all__ = ["CronScheduler"]
