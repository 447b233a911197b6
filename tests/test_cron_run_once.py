"""Run at most once: a second delivery of a cron window is suppressed by its run key, recorded."""

from __future__ import annotations

from datetime import timedelta

from support.cron import T0, make_engine, sends, store_of
from support.polling import wait_for

from celery_app.cron_tasks.cron_state import FireRequest
from celery_app.cron_tasks.recording import claim_run
from celery_app.cron_tasks.registration import GLOBAL_TENANT, cron, cron_tasks, window_id
from celery_app.cron_tasks.sender import CronHeader, CronPublisher
from celery_app.factory import settings_of
from celery_app.redis.schema import (
    CRON_CLAIM_LEASE_S,
    CronStateField,
    CronStatsField,
    Keys,
)

KEYS = Keys("cbtest")
WID = window_id(T0)


def _state(r, task_id, tenant=GLOBAL_TENANT):
    return r.hgetall(KEYS.cron_state(task_id, tenant))


def test_takeover_after_a_slow_publish_runs_the_window_once(cron_app, broker_url, r, run_worker):
    ran: list[str] = []

    @cron("* * * * *", app=cron_app, id="slow-pub", name="once.slow_pub")
    def slow_pub():
        ran.append(WID)

    req = FireRequest(cron_tasks(cron_app)["slow-pub"], GLOBAL_TENANT, T0)
    store = store_of(cron_app)
    # A beat claimed and published, but its confirmation never arrived (it stalled or died).
    store.claim([req], now=T0, owner="beat:slow")
    CronPublisher(cron_app, settings_of(cron_app).cron_grace).publish([req])
    taker = make_engine(cron_app, owner="engine-2")
    taken = taker.take_over(T0 + timedelta(seconds=CRON_CLAIM_LEASE_S + 1))
    assert taken.published == (req,)
    assert sends(broker_url) == {("slow-pub", GLOBAL_TENANT, WID): 2}  # published twice

    run_worker(cron_app, ["celery"], 3)
    wait_for(
        lambda: (
            _state(r, "slow-pub").get(CronStateField.SUPPRESSED) == "1"
            and _state(r, "slow-pub").get(CronStateField.OUTCOME) == "success"
        ),
        timeout=20,
        what="one run and one suppressed delivery",
    )
    run_worker.stop()
    assert ran == [WID]
    state = _state(r, "slow-pub")
    assert state[CronStateField.LAST_RUN_WINDOW] == WID
    assert CronStateField.LAST_ERROR not in state  # the suppressed one is not a failure
    stats = r.hgetall(KEYS.cron_stats("slow-pub"))
    assert stats[CronStatsField.SUPPRESSED] == "1"
    assert stats[CronStatsField.TAKEN_OVER] == "1"
    assert r.exists(KEYS.cron_inflight("slow-pub", GLOBAL_TENANT)) == 0  # the run released it
    assert r.exists(KEYS.cron_run("slow-pub", GLOBAL_TENANT, WID)) == 1


def test_redelivered_message_of_a_plain_task_is_refused_by_claim_run(cron_app, r, run_worker):
    """A task that is not @cron (e.g. a beat_schedule entry) checks claim_run itself."""
    bodies: list[str] = []
    answers: list[bool] = []

    @cron_app.task(bind=True, name="once.plain", shared=False)
    def plain(self):
        allowed = claim_run(self.request)
        answers.append(allowed)
        if allowed:
            bodies.append(self.request.id)

    headers = {CronHeader.TASK: "plain", CronHeader.TENANT: GLOBAL_TENANT, CronHeader.WINDOW: WID}
    run_worker(cron_app, ["celery"], 3)
    first = plain.apply_async(headers=headers, time_limit=30)
    wait_for(lambda: len(answers) == 1, timeout=20, what="the first delivery")
    plain.apply_async(headers=headers, time_limit=30)  # the same window delivered again
    wait_for(lambda: len(answers) == 2, timeout=20, what="the second delivery")
    plain.apply_async()  # no cron headers: an ordinary call always runs
    wait_for(lambda: len(answers) == 3, timeout=20, what="the plain call")
    run_worker.stop()
    assert answers == [True, False, True]
    assert bodies[0] == first.id and len(bodies) == 2
    state = _state(r, "plain")
    assert state[CronStateField.SUPPRESSED] == "1"
    assert state[CronStateField.CELERY_ID] == first.id
    ttl = r.pttl(KEYS.cron_run("plain", GLOBAL_TENANT, WID))
    assert ttl > 0  # expires: the key does not grow Redis forever
