"""Pipelined scripts on checkbeat's clients (celery_app.redis.pipelined_scripts), on the real
redis-server: a pipeline with scripts costs one round trip (no SCRIPT EXISTS first), and after
the server lost its script cache (SCRIPT FLUSH, as after a restart or a failover) every caller
still gets the replies it would have had: only the calls that got NOSCRIPT are sent again, once,
after their scripts are loaded, and nothing that succeeded runs twice."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from celery_app.redis import scripts
from celery_app.redis.client import get_redis
from celery_app.redis.pipelined_scripts import ScriptClient, ScriptPipeline
from celery_app.redis.schema import JobField, Keys
from celery_app.redis.scripts import run_script
from celery_app.settings import load_settings

pytestmark = pytest.mark.timeout(60)

#: Not idempotent, so a second run shows: each call adds 1 to its key.
BUMP = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
#: Writes, then fails with an error that is not NOSCRIPT.
FAIL = "redis.call('INCRBY', KEYS[1], 1); return redis.error_reply('boom')"


def _sha(client: redis.Redis, source: str) -> str:
    return client.script_load(source)


def _calls(client: redis.Redis, command: str) -> int:
    """Calls of ``command`` since CONFIG RESETSTAT (with its subcommands, e.g. SCRIPT EXISTS)."""
    name = f"cmdstat_{command}"
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k == name or k.startswith(f"{name}|"))


@pytest.fixture
def client(r: redis.Redis, redis_url: str, broker_url: str) -> redis.Redis:
    """checkbeat's own client of the (emptied) state db, with no script loaded."""
    state = get_redis(redis_url, load_settings(redis_url=redis_url, broker_url=broker_url))
    state.script_flush()
    state.config_resetstat()
    return state


def test_checkbeats_clients_pipelines_send_no_script_exists(client: redis.Redis) -> None:
    assert isinstance(client, ScriptClient)
    client.hset("job:a@eu", JobField.TENANT, "acme")
    pipe = client.pipeline(transaction=False)
    assert isinstance(pipe, ScriptPipeline)
    run_script(pipe, "tenants", ["job:a@eu"])
    run_script(pipe, "tenants", ["job:b@eu"])
    pipe.get("nothing")
    assert pipe.execute() == ["acme", "", None]  # loaded on its NOSCRIPT
    assert _calls(client, "script") == 1  # that one SCRIPT LOAD, no SCRIPT EXISTS
    for _ in range(3):
        pipe = client.pipeline(transaction=False)
        run_script(pipe, "tenants", ["job:a@eu"])
        assert pipe.execute() == ["acme"]
    assert _calls(client, "script") == 1
    assert _calls(client, "evalsha") == 2 + 2 + 3


def test_after_a_script_flush_only_the_failed_calls_run_again(client: redis.Redis) -> None:
    bump = _sha(client, BUMP)
    client.script_flush()
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    pipe.rpush("writes", "w")
    pipe.queue_script(bump, BUMP, ["a"], [1])
    pipe.llen("writes")
    pipe.queue_script(bump, BUMP, ["b"], [10])
    pipe.queue_script(bump, BUMP, ["a"], [100])
    pipe.get("a")
    # the replies of a pipeline that had the script: a GET ran before the re-run scripts
    assert pipe.execute() == [1, 1, 1, 10, 101, None]
    assert client.llen("writes") == 1 and client.mget("a", "b") == ["101", "10"]
    assert _calls(client, "rpush") == 1
    assert _calls(client, "evalsha") == 3 + 3  # each NOSCRIPT, then each run once
    assert _calls(client, "script") == 1  # one load for the three calls
    pipe = client.pipeline(transaction=False)
    pipe.queue_script(bump, BUMP, ["a"], [1])
    assert pipe.execute() == [102]  # loaded: no fallback
    assert _calls(client, "evalsha") == 7


def test_an_error_that_is_not_noscript_is_reported_and_not_run_again(client: redis.Redis) -> None:
    bump, fail = _sha(client, BUMP), _sha(client, FAIL)
    pipe = client.pipeline(transaction=False)
    pipe.queue_script(fail, FAIL, ["failed"], [])
    pipe.queue_script(bump, BUMP, ["a"], [1])
    with pytest.raises(ResponseError, match=r"Command # 1 .*boom") as raised:
        pipe.execute()
    assert not isinstance(raised.value, NoScriptError)
    assert client.mget("failed", "a") == ["1", "1"]

    client.script_flush()
    pipe = client.pipeline(transaction=False)
    pipe.rpush("writes", "w")
    pipe.queue_script(bump, BUMP, ["a"], [1])
    pipe.queue_script(fail, FAIL, ["failed"], [])
    pipe.llen("writes")
    with pytest.raises(ResponseError, match=r"Command # 3 .*boom"):
        pipe.execute()
    assert client.llen("writes") == 1 and client.mget("a", "failed") == ["2", "2"]

    client.script_flush()
    pipe = client.pipeline(transaction=False)
    pipe.queue_script(fail, FAIL, ["failed"], [])
    pipe.rpush("writes", "w")
    pipe.queue_script(bump, BUMP, ["a"], [1])
    replies = pipe.execute(raise_on_error=False)
    assert isinstance(replies[0], ResponseError) and "boom" in str(replies[0])
    assert not isinstance(replies[0], NoScriptError)
    assert replies[1:] == [2, 3]
    assert client.llen("writes") == 2 and client.mget("a", "failed") == ["3", "3"]


def test_a_script_lost_again_is_reported_as_noscript(client: redis.Redis) -> None:
    """A call whose re-run still finds no script (its SCRIPT LOAD failed) reports the
    NOSCRIPT: nothing is retried without end."""
    pipe = client.pipeline(transaction=False)
    pipe.queue_script("0" * 40, BUMP, ["a"], [1])  # a sha that is not the source's
    pipe.rpush("writes", "w")
    replies = pipe.execute(raise_on_error=False)
    assert isinstance(replies[0], NoScriptError) and replies[1] == 1
    assert client.get("a") is None and client.llen("writes") == 1
    assert _calls(client, "evalsha") == 2


def test_a_wait_after_a_re_run_script_is_sent_again(client: redis.Redis) -> None:
    bump = _sha(client, BUMP)
    client.script_flush()
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    pipe.queue_script(bump, BUMP, ["a"], [5])
    pipe.wait(0, 100)
    assert pipe.execute() == [5, 0]
    assert _calls(client, "wait") == 2  # it covers the re-run's write too
    pipe = client.pipeline(transaction=False)
    pipe.wait(0, 100)
    pipe.queue_script(bump, BUMP, ["a"], [5])
    assert pipe.execute() == [0, 10]
    assert _calls(client, "wait") == 3  # loaded now: one pipeline, one WAIT


def test_a_transaction_keeps_redis_pys_script_exists(client: redis.Redis) -> None:
    client.hset("job:a@eu", JobField.TENANT, "acme")
    tx = client.pipeline(transaction=True)
    run_script(tx, "tenants", ["job:a@eu"])
    tx.rpush("writes", "w")
    assert tx.execute() == ["acme", 1]
    assert _calls(client, "script") == 2  # SCRIPT EXISTS, then SCRIPT LOAD
    assert not tx.takes_bare_scripts()


def test_a_plain_redis_py_pipeline_keeps_redis_pys_behaviour(r: redis.Redis) -> None:
    r.script_flush()
    r.config_resetstat()
    r.hset("job:a@eu", JobField.TENANT, "acme")
    pipe = r.pipeline(transaction=False)
    run_script(pipe, "tenants", ["job:a@eu"])
    assert pipe.execute() == ["acme"]
    assert _calls(r, "script") == 2  # SCRIPT EXISTS, then SCRIPT LOAD, before the pipeline


def test_sentinel_and_tls_clients_build_script_pipelines(tmp_path) -> None:
    """Neither connects before its first command: the client classes are all this checks."""
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    for url, extra in (
        ("sentinel://127.0.0.1:1;sentinel://127.0.0.1:2/0", {}),
        ("rediss://127.0.0.1:1/0", {"redis_tls_ca_file": str(ca)}),
    ):
        settings = load_settings(redis_url=url, broker_url="redis://127.0.0.1:1/1", **extra)
        client = get_redis(url, settings)
        assert isinstance(client, ScriptClient), url
        assert isinstance(client.pipeline(transaction=False), ScriptPipeline), url


def test_a_refused_script_load_is_reported_in_place_of_the_noscript(
    client: redis.Redis, redis_url: str
) -> None:
    bump = _sha(client, BUMP)
    client.script_flush()
    client.acl_setuser(
        "noload", enabled=True, nopass=True, commands=["+@all", "-script"], keys=["*"]
    )
    limited = ScriptClient.from_url(redis_url, username="noload", password="x")
    try:
        pipe = limited.pipeline(transaction=False)
        pipe.queue_script(bump, BUMP, ["a"], [1])
        pipe.rpush("writes", "w")
        replies = pipe.execute(raise_on_error=False)
        assert isinstance(replies[0], NoPermissionError), replies
        assert replies[1] == 1
        assert client.get("a") is None and client.llen("writes") == 1
    finally:
        limited.close()
        client.acl_deluser("noload")


def test_a_script_called_on_a_client_is_loaded_again_after_a_flush(client: redis.Redis) -> None:
    """Outside a pipeline run_script sends EVALSHA alone; a NOSCRIPT (a restart, a failover,
    a SCRIPT FLUSH) loads the script and calls it once more."""
    keys = Keys("flushed")
    client.zadd(keys.due(), {"a@eu": 5.0})
    assert run_script(client, "due", [keys.due()], [10.0, 100]) == "a@eu"
    client.script_flush()
    assert run_script(client, "due", [keys.due()], [10.0, 100]) == "a@eu"
    assert client.script_exists(scripts._sha("due")) == [True]
