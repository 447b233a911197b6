"""Pipelined Lua scripts in one round trip: no ``SCRIPT EXISTS`` before every pipeline.

Why: redis-py's ``Script.__call__`` registers a script on the pipeline, and ``Pipeline.execute``
then asks ``SCRIPT EXISTS`` (a round trip of its own) before sending the pipeline. Every run's
completion and every claim read paid it. Here :func:`celery_app.redis.scripts.run_script` queues
a bare ``EVALSHA`` on a :class:`ScriptPipeline` (the pipelines of every plain and Sentinel
client :mod:`celery_app.redis.client` opens, with or without TLS), and the script is loaded only
when Redis says it lacks it: after a restart, a failover or a ``SCRIPT FLUSH``.

The fallback (:meth:`ScriptPipeline.execute`): a queued ``EVALSHA`` that answers NOSCRIPT did
nothing, so the missing scripts are loaded and ONLY the calls that failed with NOSCRIPT are sent
again, in their order, in one more round trip (``SCRIPT LOAD`` s, the calls, and a ``WAIT`` if the
pipeline had one after them); their replies take the failed ones' places. A command that
succeeded is never sent again (it may be a write). The one difference from a first-time success:
a re-run script runs after the pipeline's other commands, not between them (a pipeline is not a
transaction: another client's commands can come between its commands anyway). A ``WAIT`` queued
after a failed call is sent again after the re-run (a ``WAIT`` writes nothing): it then covers
the re-run's writes too, and its reply is the smaller acknowledgement of the two. No pipeline of
checkbeat has a later command read what a script in it wrote (the WAITs of complete_runs_each,
run_replicated and the cron claim are the only later commands that depend on one), but one:
``claiming.promote_and_read`` reads the candidates (``top.lua``) after ``promote.lua``: when
:attr:`ScriptPipeline.reran_scripts` says a call was re-run, it has the claim read them again
(the promoted jobs left the due index, so "the next claim" could be a whole dispatch interval
away). Keep it so.

A ``transaction=True`` pipeline (MULTI/EXEC), or one that WATCHes, keeps redis-py's
``SCRIPT EXISTS`` first: a call re-run after EXEC would no longer be atomic with the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.client import Pipeline
from redis.exceptions import NoScriptError
from redis.typing import ScriptTextT


class ScriptPipeline(Pipeline):
    """A redis-py pipeline that runs :meth:`queue_script` calls without ``SCRIPT EXISTS``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sources: dict[str, ScriptTextT] = {}
        #: the last execute() re-ran calls that got NOSCRIPT (after the pipeline's other commands)
        self.reran_scripts = False

    def reset(self) -> None:  # type: ignore[override]  # Pipeline.reset, not the RESET command
        super().reset()
        self._sources = {}  # a new dict: execute() still holds the one of the pipeline just run

    def takes_bare_scripts(self) -> bool:
        """Whether :meth:`queue_script` may be used now (not a transaction, not WATCHing)."""
        return not (
            self.transaction  # type: ignore[truthy-function]  # an attribute: Pipeline sets a bool
            or self.explicit_transaction
            or self.watching
        )

    def queue_script(
        self, sha: str, source: ScriptTextT, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        """Queue ``EVALSHA sha`` (``source`` is loaded only if Redis answers NOSCRIPT)."""
        self._sources[sha] = source
        return self.evalsha(sha, len(keys), *keys, *args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        sources = self._sources
        if not sources or not self.takes_bare_scripts():
            return super().execute(raise_on_error)
        stack = self.command_stack  # reset() in super().execute() replaces the list, keeps this
        self.reran_scripts = False
        replies = super().execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, NoScriptError):
                self._rerun(stack, replies, sources)
                break
        if raise_on_error:
            self.raise_first_error(stack, replies)
        return replies

    def _rerun(self, stack: list[Any], replies: list[Any], sources: dict[str, ScriptTextT]) -> None:
        """Load the missing scripts and send the calls that got NOSCRIPT again (one round
        trip); their replies, and those of WAITs after them, replace the ones in ``replies``."""
        failed = [
            i
            for i, reply in enumerate(replies)
            if isinstance(reply, NoScriptError)
            and stack[i][0][0] == "EVALSHA"
            and stack[i][0][1] in sources
        ]
        if not failed:
            return
        self.reran_scripts = True
        waits = [i for i in range(failed[0] + 1, len(stack)) if stack[i][0][0] == "WAIT"]
        shas = list(dict.fromkeys(stack[i][0][1] for i in failed))
        rerun = Pipeline(self.connection_pool, self.response_callbacks, False, self.shard_hint)
        for sha in shas:
            rerun.execute_command("SCRIPT LOAD", sources[sha])
        for i in failed:
            args, options = stack[i]
            rerun.execute_command(*args, **options)
        if waits:
            rerun.execute_command(*stack[waits[-1]][0])
        out = rerun.execute(raise_on_error=False)
        loads, again = dict(zip(shas, out, strict=False)), out[len(shas) :]
        for i, reply in zip(failed, again, strict=False):
            load = loads[stack[i][0][1]]
            # a SCRIPT LOAD refused (an ACL, OOM) says why better than the NOSCRIPT it causes
            replies[i] = (
                load if isinstance(load, Exception) and isinstance(reply, NoScriptError) else reply
            )
        if waits:
            for i in waits:
                replies[i] = _weaker_wait(replies[i], again[-1])


def _weaker_wait(first: Any, second: Any) -> Any:
    """Two WAIT replies over parts of one pipeline's writes: the fewer replicas (or an error)."""
    if isinstance(first, Exception):
        return first
    if isinstance(second, Exception):
        return second
    return min(first, second)


class ScriptClient(redis.Redis):
    """A ``redis.Redis`` whose pipelines are :class:`ScriptPipeline` s."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> ScriptPipeline:
        return ScriptPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
