"""``python -m celery_app.cli ...`` = ``celery ...`` with checkbeat's subcommands attached."""

from __future__ import annotations

import sys

from celery.bin.celery import celery, main

from celery_app.cli import COMMANDS


def run() -> int:
    for command in COMMANDS:
        if command.name not in celery.commands:
            celery.add_command(command)
    return main()


if __name__ == "__main__":
    sys.exit(run())
