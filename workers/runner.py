"""Running one probe of any kind under its soft limit, and folding whatever it did into a result.

Why a runner: custom kinds are user code. They may return a ProbeResult, a bool, a dict, or
nothing, and they may raise or overrun; the run task must get a ProbeResult every time, with
``timeout`` as the error class whenever the soft limit was hit (that pins the cost EWMA).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from workers.probes.result import ERROR_CLASSES, ProbeContext, ProbeResult

Probe = Callable[..., Any]


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
        detail = {
            k: v for k, v in value.items() if k not in {"ok", "latency_ms", "error_class", "error"}
        }
        if ok:
            return ProbeResult(True, latency, detail=detail)
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
    probe: Probe, target: str, config: Mapping[str, Any], context: ProbeContext
) -> tuple[ProbeResult, float]:
    """Run ``probe``; return its result and the wall time it took (ms). Never raises.

    A probe that outlives ``context.timeout_s`` is a timeout even if it then succeeded: on the
    threads pool nothing can interrupt it, so the limit is enforced on the outcome.
    """
    started = time.perf_counter()
    try:
        if _wants_context(probe):
            value = probe(target, dict(config), context)
        else:
            value = probe(target, dict(config))
        elapsed = (time.perf_counter() - started) * 1000.0
        result = normalise(value, elapsed)
    except (SoftTimeLimitExceeded, TimeoutError) as exc:
        elapsed = (time.perf_counter() - started) * 1000.0
        reason = "soft time limit" if isinstance(exc, SoftTimeLimitExceeded) else "timeout"
        return ProbeResult.down(
            "timeout", f"{reason} ({context.timeout_s:g} s) exceeded", elapsed
        ), elapsed
    except Exception as exc:  # user code: any failure is a result
        elapsed = (time.perf_counter() - started) * 1000.0
        return ProbeResult.down("error", f"{type(exc).__name__}: {exc}", elapsed), elapsed
    if not result.timed_out and elapsed > context.timeout_s * 1000.0:
        result = ProbeResult.down(
            "timeout",
            f"ran {elapsed / 1000:.2f} s, over its {context.timeout_s:g} s limit",
            elapsed,
        )
    return result, elapsed
