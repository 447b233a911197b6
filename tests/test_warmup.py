"""The worker's warm-up builds what its first runs use, with the arguments the runs use."""

from __future__ import annotations

import redis
from support.http_target import DelayServer

from celery_app.factory import settings_of
from celery_app.redis import scripts
from workers.probes.http import http_probe, tls_context
from workers.probes.result import ProbeContext
from workers.target_guard import AddressPolicy
from workers.warmup import warm_up


def test_after_the_warm_up_a_first_run_builds_no_tls_context_and_no_script(dispatcher_app):
    tls_context.cache_clear()
    scripts._script.cache_clear()
    scripts._sha.cache_clear()
    settings = settings_of(dispatcher_app)
    client = redis.Redis.from_url(settings.redis_url)
    client.script_flush()  # a restarted server
    warm_up(dispatcher_app)
    assert scripts._sha.cache_info().currsize == len(scripts.script_names()) > 10
    # and loaded on the server: a refill's first pipelined claim reads its candidates in order
    assert all(client.script_exists(*[scripts._sha(n) for n in scripts.script_names()]))
    built = tls_context.cache_info()
    context = ProbeContext(
        5.0, AddressPolicy(allow_private=True), tls_ca_file=settings.probe_tls_ca_file
    )
    with DelayServer() as server:
        assert http_probe(server.url("/delay/0"), {}, context).ok
    after = tls_context.cache_info()
    assert (after.misses, after.currsize) == (built.misses, built.currsize) == (1, 1)
    assert after.hits == built.hits + 1
