"""The suite's ``CHECKBEAT_*`` environment: exactly the values the suite sets, nothing else.

A developer's shell may export ``CHECKBEAT_REGIONS``, ``CHECKBEAT_KEY_PREFIX`` or a
``CHECKBEAT_REDIS_URL`` of their own; settings read the environment, so any of them would change
what the tests test (and every subprocess they start inherits it). The suite therefore drops every
``CHECKBEAT_*`` variable it did not set itself, once at start-up and again before each test (a test
that set one without monkeypatch cannot leak it into the next).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

PREFIX = "CHECKBEAT_"


def reset_checkbeat_environment(
    environ: MutableMapping[str, str], suite: Mapping[str, str]
) -> list[str]:
    """Make the ``CHECKBEAT_*`` variables of ``environ`` exactly ``suite``; return the names of
    those it removed. Variables without the prefix are left alone."""
    assert all(name.startswith(PREFIX) for name in suite), suite
    removed = sorted(name for name in environ if name.startswith(PREFIX) and name not in suite)
    for name in removed:
        del environ[name]
    environ.update(suite)
    return removed
