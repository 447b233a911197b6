"""Helpers the tests import by name: functions, constants and small classes, never fixtures.

Fixtures live in ``tests/conftest.py`` and in the plugin modules its ``pytest_plugins`` lists
(``beat_fixtures``, ``checks_fixtures``, ``worker_fixtures``, ``faults.fault_report``), so a test
module only names the fixtures it uses as arguments and imports these helpers normally.
"""
