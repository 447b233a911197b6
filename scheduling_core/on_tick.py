"""Starting on the tick: when the dispatcher wakes next, and how long a claimed run waits.

Why: a dispatcher on a fixed interval starts a due check up to one interval late (0.5 s by
default). Instead it claims what is due within a short *lead* and wakes again when the next job
enters that lead; the worker that got the run waits, in its own slot, until the tick measured on
the server's clock. Under spare capacity the probe then starts on its tick and never before.

Times are float seconds (Unix seconds on the server's clock, or durations).
"""

from __future__ import annotations

#: The longest a worker waits for a tick: the bound of ``CHECKBEAT_DISPATCH_LEAD``.
MAX_LEAD_S = 5.0


def dispatch_wait(
    now_s: float, next_due_s: float | None, lead_s: float, interval_s: float
) -> float:
    """Seconds until the dispatcher should run again, at most ``interval_s``.

    It runs when the next due job (``next_due_s``, None if there is none) enters the lead, but
    not sooner than half a lead from now: each run then claims every job due within
    ``[lead / 2, lead]`` ahead, in batches, instead of waking once per job.
    """
    if next_due_s is None:
        return interval_s
    enters = next_due_s - lead_s - now_s
    return min(interval_s, max(enters, lead_s / 2.0))


def tick_wait(scheduled_at_s: float, server_now_s: float, elapsed_s: float) -> float:
    """Seconds a run must still wait so that it starts at or after its tick, at most
    :data:`MAX_LEAD_S`.

    ``server_now_s`` is a server time read ``elapsed_s`` ago (on a monotonic clock); the reply
    was produced before it was received, so ``server_now_s + elapsed_s`` is a lower bound of the
    server's time now: waiting on it never starts a run early, whatever the local wall clock says.
    """
    wait = scheduled_at_s - (server_now_s + elapsed_s)
    return min(max(wait, 0.0), MAX_LEAD_S)
