"""Checks: definitions and kinds, the job store, dispatch, rate limits, capacity, repair,
reports, and the run contract."""
