"""A prefork pool child never uses its parent's Redis pools.

A pool lock that a parent thread (the capacity heartbeat, a metrics scrape) holds at the moment
of the fork stays held forever in the child; redis-py's own fork check takes that lock, so a
child that reused the parent's client hung on its first command (seen in CI: a run stuck in
``ConnectionPool._checkpid`` until its soft time limit). The fork hooks give the child fresh
clients and a fresh refill dispatcher.
"""

from __future__ import annotations

import os
import signal
import threading

from celery_app.redis.client import get_redis


def _fork_while_the_pool_lock_is_held(lock: threading.Lock, in_child) -> int:
    """Fork while another thread holds ``lock``; run ``in_child`` there (SIGALRM after 10 s);
    return the child's exit status (0: ``in_child`` returned)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists, the lock is held by nobody alive
        code = 1
        try:
            signal.alarm(10)
            in_child()
            code = 0
        finally:
            os._exit(code)
    try:
        _pid, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join(10)
    return os.waitstatus_to_exitcode(status)


def test_a_child_forked_while_a_parent_thread_holds_the_pool_lock_gets_a_client_of_its_own(
    settings,
):
    parent = get_redis(settings.redis_url, settings)
    assert parent.ping()
    code = _fork_while_the_pool_lock_is_held(
        parent.connection_pool._lock,
        lambda: get_redis(settings.redis_url, settings).ping(),
    )
    assert code == 0  # without the hook: killed by the alarm (-14), hung in _checkpid
    assert get_redis(settings.redis_url, settings) is parent  # the parent keeps its own


def test_a_child_builds_its_own_refill_dispatcher(settings, dispatcher_app):
    from celery_app.checks import dispatch

    parent = dispatch._refiller(dispatcher_app)

    def child() -> None:
        mine = dispatch._refiller(dispatcher_app)
        assert mine is not parent
        assert mine.redis.ping()

    code = _fork_while_the_pool_lock_is_held(parent.redis.connection_pool._lock, child)
    assert code == 0
