"""Cron tasks: registration, window state, firing, recording, and the tenants they fan out to."""
