"""``checks apply -f checks.yaml [--prune] [--dry-run]`` and ``checks export``: checks as code.

Registered on the ``checks`` group by :mod:`celery_app.cli.checks`. A refused file exits 2 (bad
input) with every problem listed (file line, item index, field) and nothing written; a file
larger than :data:`~celery_app.checks.manifest.MAX_FILE_BYTES` is refused before it is parsed;
``--dry-run`` prints the diff and writes nothing. The format: ``docs/checks-as-code.md``.
"""

from __future__ import annotations

import sys
import time

import click

from celery_app.checks.manifest import MAX_FILE_BYTES, ManifestError, load_manifest, too_large
from celery_app.checks.manifest_sync import (
    apply_plan,
    dump_manifest,
    export_manifest,
    plan_manifest,
)
from celery_app.checks.store import CheckStore
from celery_app.cli.common import BadInput, load_app
from celery_app.cli.terminal import escape
from celery_app.errors import CheckExists


def _read(path: str) -> tuple[str, str]:
    """The file's text, read up to one byte past the size cap (a larger one is refused
    without being read whole)."""
    source = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            stdin = getattr(sys.stdin, "buffer", None)  # a text-only stdin (embedding): encode
            data = (
                stdin.read(MAX_FILE_BYTES + 1)
                if stdin is not None
                else sys.stdin.read(MAX_FILE_BYTES + 1).encode()
            )
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"{escape(path)}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise BadInput(f"{escape(source)}: {too_large()} (nothing written)")
    try:
        return data.decode("utf-8"), source
    except UnicodeDecodeError as exc:
        raise BadInput(f"{escape(source)}: not UTF-8 text: {exc}") from None


@click.command("apply")
@click.option("-f", "--file", "path", required=True, help="The checks file (YAML); - = stdin.")
@click.option(
    "--prune", is_flag=True, help="Delete checks (and windows) of the file's tenants it omits."
)
@click.option("--dry-run", is_flag=True, help="Print the diff; write nothing.")
@click.pass_context
def apply(ctx: click.Context, path: str, prune: bool, dry_run: bool) -> None:
    """Make the store match a checks file: validate all of it, then create / update / delete."""
    store = CheckStore.for_app(load_app(ctx))
    text, source = _read(path)
    started = time.perf_counter()
    try:
        manifest = load_manifest(text, store.settings, registry=store.registry, source=source)
    except ManifestError as exc:
        shown = "\n".join(escape(line) for line in str(exc).splitlines())  # one a line
        raise BadInput(shown) from None
    validated = time.perf_counter()
    try:
        plan = plan_manifest(store, manifest, prune=prune, source=source)
    except ManifestError as exc:
        shown = "\n".join(escape(line) for line in str(exc).splitlines())
        raise click.ClickException(shown) from None
    planned = time.perf_counter()
    if dry_run:
        for line in plan.lines():
            click.echo(escape(line))
        click.echo(f"dry run: {plan.summary()}; nothing written")
    elif plan.empty:
        click.echo(f"no changes ({plan.unchanged} check(s) already match)")
    else:
        try:
            done = apply_plan(store, plan)
        except CheckExists as exc:
            raise click.ClickException(f"{exc} (created meanwhile; apply again)") from None
        click.echo(
            f"applied: {done.created} created, {done.updated} updated, {done.deleted} deleted, "
            f"{done.rate_limits} rate limit(s) changed, {done.windows_added} window(s) added, "
            f"{done.windows_removed} removed, {done.targets_added} notification target(s) "
            f"added, {done.targets_removed} removed, {plan.unchanged} unchanged "
            f"(read+validate {validated - started:.1f} s, diff {planned - validated:.1f} s, "
            f"write {done.seconds:.1f} s)"
        )


@click.command("export")
@click.option("-f", "--file", "path", default="-", show_default=True, help="Where; - = stdout.")
@click.option("--tenant", help="Only this tenant's checks, rate limit and windows.")
@click.option(
    "--include-secrets",
    is_flag=True,
    help="Write URL passwords, credential query values and header values as stored "
    "(default: '***', which apply keeps as stored).",
)
@click.pass_context
def export(ctx: click.Context, path: str, tenant: str | None, include_secrets: bool) -> None:
    """Write the store's checks, rate limits and maintenance windows in the checks-file format
    (apply-able; secrets masked unless --include-secrets)."""
    store = CheckStore.for_app(load_app(ctx))
    document = export_manifest(store, tenant, include_secrets=include_secrets)
    text = dump_manifest(document, include_secrets=include_secrets)
    if path == "-":
        click.echo(text, nl=False)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise BadInput(f"{escape(path)}: cannot write: {exc.strerror or exc}") from None
    count = text.count("\n- uid: ")
    click.echo(f"exported {count} check(s) to {escape(path)}", err=True)
