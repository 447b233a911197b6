"""A user's Celery project adopting checkbeat as README.md tells, run from an installed wheel
(copied to a tmp dir by tests/test_wheel_e2e.py)."""
