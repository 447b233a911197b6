"""Prometheus metrics of beat and workers: the definitions (once), the recording functions the
hooks call, the HTTP server of ``/metrics`` and ``/healthz``, and prefork aggregation.

Why under celery_app: beat and workers never import each other, and both record dispatch and
cron series, so the names live below them (see docs/metrics.md for the list).
"""
