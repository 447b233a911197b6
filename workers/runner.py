"""Running one probe of any kind under its soft limit, and folding whatever it did into a result.

Why a runner: custom kinds are user code. They may return a ProbeResult, a bool, a dict, or
nothing, and they may raise or overrun; the run task must get a ProbeResult every time, with
``timeout`` as the error class whenever the soft limit was hit (that pins the cost EWMA).

Only the built-in kinds are interruptible: they are marked with
:func:`workers.deadline.honours_deadline` and return by the run's deadline themselves (every
socket operation is bounded by it), so they run inline. A custom kind is user code that may
block anywhere, and a thread cannot be killed:

- on a pool worker *thread* (``-P threads``: nothing can interrupt the task) it runs in a
  daemon helper thread and the runner stops waiting at the deadline: the run is a ``timeout``
  whose detail says the probe's thread is still running, and :func:`stuck_probes` counts such
  threads in this process until they return (for the capacity registration to report). At most
  :data:`MAX_STUCK_PROBES` are left behind; past that the runner waits for the probe again, as
  it did before, so a kind that always hangs costs slots, not an unbounded number of threads;
- in the main thread (``-P prefork``/``solo``) it runs inline as before: Celery's soft limit
  interrupts it there (a helper thread would not see that signal) and the hard limit kills the
  child.

Either way a result that comes after the limit is a timeout, even if the probe then succeeded.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from workers.deadline import HONOURS_DEADLINE_ATTR, Deadline
from workers.probes.result import ERROR_CLASSES, ProbeContext, ProbeResult

Probe = Callable[..., Any]
log = logging.getLogger(__name__)

#: The most abandoned probe threads one process keeps; past it a custom probe holds its slot.
MAX_STUCK_PROBES = 32

_stuck_lock = threading.Lock()
_stuck = 0
#: Called with the new count whenever it changes (the capacity registration reports it at once,
#: so the refill right after an abandoned run already counts the stuck slot as busy).
_listeners: list[Callable[[int], None]] = []


def stuck_probes() -> int:
    """How many custom probes this process stopped waiting for are still running."""
    with _stuck_lock:
        return _stuck


def on_stuck_change(listener: Callable[[int], None]) -> Callable[[], None]:
    """Call ``listener(count)`` on every change of :func:`stuck_probes`; returns the remover."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener) if listener in _listeners else None


def _notify(count: int) -> None:
    for listener in list(_listeners):
        try:
            listener(count)
        except Exception:  # a report that failed is repeated by the next heartbeat
            log.exception("checkbeat: reporting %d stuck probe(s) failed", count)


class _ProbeThread(threading.Thread):
    """Runs one custom probe; hands back its value or exception, or is abandoned."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(name="checkbeat-probe", daemon=True)
        self._call = call
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._finished = False
        self._abandoned = False

    def run(self) -> None:
        global _stuck
        try:
            self.value = self._call()
        except BaseException as exc:  # handed to the runner (or dropped if abandoned)
            self.error = exc
        finally:
            with _stuck_lock:
                self._finished = True
                if self._abandoned:
                    _stuck -= 1
                count = _stuck
            self.done.set()
            self._call = None  # type: ignore[assignment]  # drop the probe's arguments
            if self._abandoned:
                _notify(count)  # its slot is free again

    def abandon(self) -> int | None:
        """Stop waiting: the new count of stuck probes, or None if the probe finished meanwhile
        or the process already holds :data:`MAX_STUCK_PROBES` (then wait for it)."""
        global _stuck
        with _stuck_lock:
            if self._finished or _stuck >= MAX_STUCK_PROBES:
                return None
            self._abandoned = True
            _stuck += 1
            return _stuck


class _StillRunning(Exception):
    def __init__(self, stuck: int) -> None:
        super().__init__(stuck)
        self.stuck = stuck


def _call_in_thread(call: Callable[[], Any], deadline: Deadline) -> Any:
    """``call()`` in a helper thread, waited for until ``deadline`` (see module doc)."""
    thread = _ProbeThread(call)
    thread.start()
    if not thread.done.wait(deadline.remaining()):
        stuck = thread.abandon()
        if stuck is not None:
            _notify(stuck)
            raise _StillRunning(stuck)
        thread.done.wait()  # finished meanwhile, or too many left behind: wait as inline
    if thread.error is not None:
        raise thread.error
    return thread.value


@cache
def _wants_context(probe: Probe) -> bool:
    """Built-in probes take (target, config, context); a user's may take only (target, config)."""
    try:
        params = list(inspect.signature(probe).parameters.values())
    except (TypeError, ValueError):
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.name == "context" for p in params)


def normalise(value: Any, elapsed_ms: float) -> ProbeResult:
    """A probe's return value as a ProbeResult (see module doc for what is accepted)."""
    if isinstance(value, ProbeResult):
        return value
    if value is None or value is True:
        return ProbeResult.up(elapsed_ms)
    if value is False:
        return ProbeResult.down("error", "the probe reported failure", elapsed_ms)
    if isinstance(value, Mapping) and "ok" in value:
        ok = bool(value["ok"])
        latency = value.get("latency_ms")
        latency = (
            float(latency) if isinstance(latency, int | float) and latency >= 0 else elapsed_ms
        )
        reserved = {"ok", "latency_ms", "error_class", "error", "degraded"}
        detail = {k: v for k, v in value.items() if k not in reserved}
        if ok:
            reason = value.get("degraded")  # a custom kind's reason for a degraded success
            degraded = str(reason)[:500] if reason else None
            return ProbeResult(True, latency, detail=detail, degraded=degraded)
        error_class = value.get("error_class")
        if error_class not in ERROR_CLASSES:
            error_class = "error"
        return ProbeResult(False, latency, error_class, str(value.get("error") or "down"), detail)
    return ProbeResult.down(
        "error",
        f"the probe returned {type(value).__name__}; return a ProbeResult or bool",
        elapsed_ms,
    )


def run_probe(
    probe: Probe,
    target: str,
    config: Mapping[str, Any],
    context: ProbeContext,
    *,
    in_thread: bool | None = None,
) -> tuple[ProbeResult, float]:
    """Run ``probe``; return its result and the wall time it took (ms). Never raises.

    The run's :class:`~workers.deadline.Deadline` starts here and is passed down as
    ``context.deadline``. A probe that outlives ``context.timeout_s`` is a timeout even if it
    then succeeded. ``in_thread``: run the probe in a helper thread the runner stops waiting for
    at the deadline; default (None): for a probe not marked ``honours_deadline`` when called
    from a thread other than the main thread (see module doc).
    """
    started = time.perf_counter()
    if context.deadline is None:
        context = dataclasses.replace(context, deadline=Deadline(context.timeout_s))
    deadline = context.run_deadline()
    if in_thread is None:
        in_thread = (
            not getattr(probe, HONOURS_DEADLINE_ATTR, False)
            and threading.current_thread() is not threading.main_thread()
        )
    arguments = (target, dict(config), context) if _wants_context(probe) else (target, dict(config))

    def call() -> Any:
        return probe(*arguments)

    def elapsed_ms() -> float:
        return (time.perf_counter() - started) * 1000.0

    try:
        value = _call_in_thread(call, deadline) if in_thread else call()
        elapsed = elapsed_ms()
        result = normalise(value, elapsed)
    except (SoftTimeLimitExceeded, TimeoutError) as exc:
        elapsed = elapsed_ms()
        reason = "soft time limit" if isinstance(exc, SoftTimeLimitExceeded) else "timeout"
        return ProbeResult.down(
            "timeout", f"{reason} ({context.timeout_s:g} s) exceeded", elapsed
        ), elapsed
    except _StillRunning as still:
        elapsed = elapsed_ms()
        return ProbeResult.down(
            "timeout",
            f"still running at its {context.timeout_s:g} s limit: the runner stopped waiting, "
            f"its thread runs on ({still.stuck} such in this process)",
            elapsed,
            probe_thread="still running",
            stuck_probes=still.stuck,
        ), elapsed
    except Exception as exc:  # user code: any failure is a result
        elapsed = elapsed_ms()
        return ProbeResult.down("error", f"{type(exc).__name__}: {exc}", elapsed), elapsed
    if not result.timed_out and elapsed > context.timeout_s * 1000.0:
        result = ProbeResult.down(
            "timeout",
            f"ran {elapsed / 1000:.2f} s, over its {context.timeout_s:g} s limit",
            elapsed,
        )
    return result, elapsed
