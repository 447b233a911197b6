"""Redis Cluster settings: ``CHECKBEAT_REDIS_URL=redis+cluster://h:p[,h:p...]`` parses into its
startup nodes; a malformed one, a cluster broker, a cluster without a broker of its own, or WAIT
replicas on a cluster are refused with the field named and why; plain and Sentinel URLs keep
today's key names."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from support.projects import run_module

from celery_app.cli.common import EXIT_CANNOT_RUN
from celery_app.cluster_url import ClusterUrl, parse_cluster_url
from celery_app.redis.keyspace import state_keys
from celery_app.settings import SettingsError, load_settings

BROKER = "redis://127.0.0.1:6379/0"
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("redis+cluster://10.0.0.1:7000", ClusterUrl((("10.0.0.1", 7000),))),
        (
            "redis+cluster://a:7000,b:7001,[::1]:7002/0",
            ClusterUrl((("a", 7000), ("b", 7001), ("::1", 7002))),
        ),
        ("redis+cluster://h", ClusterUrl((("h", 6379),))),
        (
            "rediss+cluster://user:p%40ss@h:7000,h2:7000",
            ClusterUrl((("h", 7000), ("h2", 7000)), tls=True, username="user", password="p@ss"),
        ),
    ],
)
def test_cluster_urls_parse_into_startup_nodes(url, parsed):
    assert parse_cluster_url(url) == parsed
    settings = load_settings(redis_url=url, broker_url=BROKER)
    assert state_keys(settings).cluster


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://", "no host:port"),
        ("redis+cluster://h:0", "port must be 1-65535"),
        ("redis+cluster://h:70000", "port must be 1-65535"),
        ("redis+cluster://h:x", "port must be 1-65535"),
        ("redis+cluster://h:7000/1", "only database 0"),
        ("redis+cluster://h:7000?ssl=true", "query options"),
        ("redis+cluster://[::1:7000", "unclosed IPv6"),
        ("redis+cluster://:7000", "no host"),
    ],
)
def test_a_malformed_cluster_url_names_the_field_and_the_form(url, why):
    with pytest.raises(SettingsError) as caught:
        load_settings(redis_url=url, broker_url=BROKER)
    text = str(caught.value)
    assert "CHECKBEAT_REDIS_URL=" in text and why in text, text
    assert "redis+cluster://[user:password@]host:port[,host:port...]" in text


def test_the_broker_cannot_be_a_cluster():
    with pytest.raises(SettingsError) as caught:
        load_settings(redis_url="redis+cluster://h:7000", broker_url="redis+cluster://h:7000")
    text = str(caught.value)
    assert "CHECKBEAT_BROKER_URL=" in text and "kombu has no Cluster transport" in text, text


def test_a_cluster_state_store_needs_a_broker_of_its_own(monkeypatch):
    monkeypatch.delenv("CHECKBEAT_BROKER_URL", raising=False)  # the suite sets one
    with pytest.raises(SettingsError) as caught:
        load_settings(redis_url="redis+cluster://h:7000")
    text = str(caught.value)
    assert "CHECKBEAT_BROKER_URL must be set" in text and "CHECKBEAT_REDIS_URL" in text, text


def test_wait_replicas_on_a_cluster_are_named_by_the_operator():
    # WAIT goes to each master a write went to (celery_app/redis/replication.py); -1 is 0 here
    for wanted in (-1, 0, 1, 16):
        settings = load_settings(
            redis_url="redis+cluster://h:7000", broker_url=BROKER, redis_wait_replicas=wanted
        )
        assert settings.redis_wait_replicas == wanted
    with pytest.raises(SettingsError, match=r"CHECKBEAT_REDIS_WAIT_REPLICAS=17.*<= 16"):
        load_settings(redis_url="redis+cluster://h:7000", broker_url=BROKER, redis_wait_replicas=17)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/1", "rediss://h:6380/0", "sentinel://h:26379;sentinel://g:26379/1"],
)
def test_plain_and_sentinel_urls_keep_todays_key_names(url):
    # with one partition (the default, whatever the suite's --check-partitions): today's names
    settings = load_settings(
        redis_url=url, broker_url=BROKER, key_prefix="checkbeat", check_partitions=1
    )
    keys = state_keys(settings)
    assert not keys.cluster
    assert keys.job("u@eu") == "checkbeat:job:u@eu"
    assert keys.cron_window("t", "x", "w") == "checkbeat:cron:win:t:x:w"


def test_an_unreachable_cluster_is_one_line_naming_the_url_and_exits_2(tmp_path):
    with socket.socket() as one, socket.socket() as two:  # bound, then released: nothing listens
        one.bind(("127.0.0.1", 0))
        two.bind(("127.0.0.1", 0))
        ports = one.getsockname()[1], two.getsockname()[1]
    url = f"redis+cluster://:s3cret@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    done = run_module(
        "celery", "-A", "celery_app", "checks", "list", cwd=tmp_path, pythonpath=[REPO],
        CHECKBEAT_REDIS_URL=url, CHECKBEAT_BROKER_URL=BROKER,
    )  # fmt: skip
    assert done.returncode == EXIT_CANNOT_RUN, done.stderr
    masked = f"redis+cluster://:***@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    assert done.stderr.splitlines() == [
        f"Error: cannot reach Redis at {masked} (Connection refused); is it running? "
        "(CHECKBEAT_REDIS_URL)"
    ], done.stderr
