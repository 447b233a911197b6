"""The broker transport: kombu's Redis channel, keeping one redis-py client per pool
(celery_app/redis/kombu_redis.py) instead of building one for every publish and ack."""

from __future__ import annotations

import redis
from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

from celery_app.factory import create_app, install
from celery_app.redis import kombu_redis
from celery_app.settings import load_settings


def app_for(broker_url: str, redis_url: str) -> Celery:
    return create_app(load_settings(redis_url=redis_url, broker_url=broker_url))


def test_checkbeat_apps_and_installed_user_apps_use_the_shared_client_transport(
    broker_url, redis_url
):
    assert isinstance(app_for(broker_url, redis_url).connection_for_write().transport,
                      kombu_redis.Transport)  # fmt: skip
    user = install(Celery("user-project", broker=broker_url))
    with user.connection_for_write() as conn:
        assert isinstance(conn.default_channel, kombu_redis.Channel)


def test_messages_are_published_and_acked_through_one_client(broker_url, redis_url, monkeypatch):
    built = []
    real_init = redis.Redis.__init__

    def counting_init(self, *args, **kwargs):
        built.append(self)
        real_init(self, *args, **kwargs)

    app = app_for(broker_url, redis_url)
    redis.Redis.from_url(broker_url).delete("kombu-shared")
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue("kombu-shared")
        queue.put({"n": -1})  # the channel and its pools exist from here on
        queue.get(timeout=5).ack()
        monkeypatch.setattr(redis.Redis, "__init__", counting_init)
        for n in range(20):
            queue.put({"n": n})
        got = []
        for _ in range(20):
            message = queue.get(timeout=5)
            got.append(message.payload["n"])
            message.ack()
        monkeypatch.undo()
        queue.close()
    assert got == list(range(20))
    assert len(built) <= 1  # kombu's own channel builds one per put and per ack: 40 here
    assert redis.Redis.from_url(broker_url).llen("kombu-shared") == 0


def test_a_replaced_pool_gets_a_client_of_its_own(broker_url, redis_url):
    app = app_for(broker_url, redis_url)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first and first.connection_pool is channel.pool
        channel._pool = None  # what kombu does after a connection error
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert second.ping()


def test_register_leaves_a_transport_someone_else_registered_alone(monkeypatch):
    monkeypatch.setitem(TRANSPORT_ALIASES, "redis", "their.module:Transport")
    monkeypatch.setitem(TRANSPORT_ALIASES, "rediss", kombu_redis.KOMBU_TRANSPORT)
    kombu_redis.register()
    assert TRANSPORT_ALIASES["redis"] == "their.module:Transport"
    assert TRANSPORT_ALIASES["rediss"] == kombu_redis.TRANSPORT


def test_closing_a_channel_after_its_transport_let_go_is_a_connection_error_not_a_crash(
    broker_url, redis_url
):
    """Seen in CI (tests/faults/test_broker_outage.py): the broker went away with a message
    unacked; closing the consumer's connection restored the unacked messages after kombu had
    dropped the pool and detached the transport, and kombu's AttributeError ended the worker.
    Here the channel is put in that state, and kombu's own close of it must not raise."""
    broker = redis.Redis.from_url(broker_url)
    broker.delete("kombu-close")
    conn = app_for(broker_url, redis_url).connection_for_write()
    queue = conn.SimpleQueue("kombu-close")
    queue.put({"n": 1})
    message = queue.get(timeout=5)  # delivered, not acked
    channel = conn.default_channel
    assert channel.qos._delivered
    channel._disconnect_pools()
    conn.transport.client = None  # what the worker's log showed at the crash
    conn.maybe_close_channel(channel)  # ignores connection errors only
    assert broker.hexists("unacked", message.delivery_tag)  # not lost: the restore waits
    broker.hdel("unacked", message.delivery_tag)
    broker.zrem("unacked_index", message.delivery_tag)


def _broker_calls(broker: redis.Redis, *commands: str) -> int:
    stats = broker.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in commands)


def test_a_queue_consumed_without_acks_leaves_no_unacked_copy_and_its_ack_sends_nothing(
    broker_url, redis_url
):
    """checkbeat's check queues (``workers.worker_step.consume_without_acks``): kombu keeps no
    unacked copy, and Celery's ack of every task costs no round trip. A queue consumed with
    acks still records each delivery and removes it on the ack."""
    from kombu import Consumer, Queue

    broker = redis.Redis.from_url(broker_url)
    app = app_for(broker_url, redis_url)
    with app.connection_for_write() as conn:
        for name, no_ack in (("kombu-noack", True), ("kombu-acked", False)):
            broker.delete(name, "unacked", "unacked_index")
            producer = conn.Producer()
            for n in range(5):
                producer.publish({"n": n}, routing_key=name, serializer="json")
            got: list = []
            queue = Queue(name, routing_key=name, no_ack=no_ack)
            with Consumer(conn, [queue], callbacks=[lambda _body, m, got=got: got.append(m)]):
                while len(got) < 5:
                    conn.drain_events(timeout=5)
                recorded = broker.hlen("unacked")
                before = _broker_calls(broker, "multi", "zrem", "hdel")
                for message in got:
                    message.ack()
                sent = _broker_calls(broker, "multi", "zrem", "hdel") - before
            if no_ack:
                assert recorded == 0 and sent == 0
            else:
                assert recorded == 5 and sent == 15  # MULTI, ZREM, HDEL per ack
                assert broker.hlen("unacked") == 0
