"""A user's own Celery project that adopts checkbeat (copied to a tmp dir by test_user_app)."""
