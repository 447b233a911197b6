"""checkbeat's Celery application, registries and Redis state.

``celery -A celery_app worker|beat|schedule|checks`` resolves ``celery_app.app``.
"""

from celery_app.app import create_app, settings_of
from celery_app.settings import Settings, get_settings, load_settings

app = create_app()

__all__ = ["Settings", "app", "create_app", "get_settings", "load_settings", "settings_of"]
