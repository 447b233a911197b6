"""Helpers the tests import by name: functions, constants and small classes, never fixtures.

Fixtures live in ``tests/conftest.py`` and in the plugin modules its ``pytest_plugins`` lists
(``beat_fixtures``, ``checks_fixtures``, ``worker_fixtures``, ``faults.fault_report``, ...), so a
test module only names the fixtures it uses as arguments and imports these helpers normally.

The benches import a few of them too (``http_target``, ``capacity``, ``round_trips``,
``alternated_rounds``, ``polling``, ``background``, as ``tests.support.<name>`` from the
repository root); a test never imports ``bench/``, it runs a bench as a process
(:mod:`support.benches`).
"""
