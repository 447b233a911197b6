"""The ``checkbeat`` console script: ``up`` runs everything locally, ``status`` prints the view.

Operating a deployed system goes through Celery's own command line instead
(``celery -A celery_app schedule|checks|tenants ...``), so it works wherever Celery does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its refusal one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, got {text[:30]!r}")
    return port


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="checkbeat",
        description="Run checkbeat locally, or print the state of a running system.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    up = commands.add_parser(
        "up",
        help="start Redis (unless CHECKBEAT_REDIS_URL is set), beat, lane workers and Flower",
    )
    up.add_argument("--demo", action="store_true", help="add demo checks, tenants and a target")
    up.add_argument("--no-view", dest="view", action="store_false", help="print logs, no view")
    up.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".checkbeat"),
        help="where the embedded Redis keeps its data and the children their logs",
    )
    up.add_argument("--flower-port", type=_port, default=5555, help="0 picks a free port")

    status = commands.add_parser("status", help="one-shot view of a running system")
    status.add_argument("--json", action="store_true", help="print the same data as JSON")
    status.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".checkbeat"),
        help="find the Redis of a `checkbeat up` started from this directory",
    )
    commands.add_parser(
        "settings", help="print every CHECKBEAT_* variable with its default (Markdown table)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a bad CHECKBEAT_* variable, or a module on sys.path named like a
    checkbeat package the command needs (``up`` starts beat and workers), is a message and exit
    code 2, no traceback."""
    from celery_app.settings import SettingsError
    from celery_app.shadowing import PACKAGES, clashes

    args = _parser().parse_args(argv)
    if args.command == "up":  # its children are `python -m celery` from this directory
        found = clashes(PACKAGES, cwd_first=True)
    else:
        found = clashes(("celery_app", "scheduling_core"))
    if found:
        for clash in found:
            print(f"checkbeat: {clash}", file=sys.stderr)
        return 2
    try:
        return _run(args)
    except SettingsError as exc:
        print(f"checkbeat: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "settings":
        from celery_app.settings import settings_markdown

        print(settings_markdown())
        return 0
    if args.command == "up":
        from celery_app.local.up import UpOptions, run_up

        options = UpOptions(
            data_dir=args.data_dir, demo=args.demo, view=args.view, flower_port=args.flower_port
        )
        return run_up(options)
    from celery_app.cli.common import CannotRun, reported_as_cannot_run
    from celery_app.local.bootstrap import fresh_app
    from celery_app.local.status import collect_status, load_env_file
    from celery_app.settings import get_settings

    load_env_file(args.data_dir)
    try:
        with reported_as_cannot_run(get_settings):
            app = fresh_app()
            data = collect_status(app)
    except CannotRun as exc:
        hint = "; `checkbeat up` starts one" if "cannot reach" in exc.format_message() else ""
        print(f"checkbeat status: {exc.format_message()}{hint}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        json.dump(data, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from rich.console import Console

        from celery_app.local.view import render

        Console().print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
