"""How a bench is started from the command line, and how it hands over its figures.

Every bench's ``main(argv)`` prints its table and returns the figures it printed, as data.
``python -m bench.<name> ... --json`` writes those figures to stdout as one JSON document and
sends everything else (the table, the progress lines, whatever the processes it starts print) to
stderr, so a reader (the smoke tests in ``tests/``, a script comparing two commits) parses the
numbers rather than the text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any


def quick_or_full(
    argv: Sequence[str] | None, description: str, quick: int, full: int, what: str
) -> int:
    """How many ``what`` a bench whose one option is ``--quick`` runs with: ``full``, or
    ``quick`` (a smoke run) with ``--quick``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=f"{quick:,} {what} (smoke)")
    return quick if parser.parse_args(argv).quick else full


def refuse_out_of_range(
    parser: argparse.ArgumentParser,
    seconds: Sequence[tuple[str, float | None]] = (),
    counts: Sequence[tuple[str, int | None]] = (),
) -> None:
    """Refuse (``parser.error``: one line naming the option, exit 2) a duration of ``seconds``
    not above 0, or a number of ``counts`` below 1; ``None`` is an option not given."""
    for name, value in seconds:
        if value is not None and not value > 0:
            parser.error(f"{name} takes seconds above 0, not {value:g}")
    for name, value in counts:
        if value is not None and value < 1:
            parser.error(f"{name} takes a whole number from 1, not {value}")


def command_line(main: Callable[[list[str]], Any], argv: Sequence[str] | None = None) -> None:
    """Run ``main`` on the command line's arguments; with ``--json`` (taken out before ``main``
    sees them) print what it returns as JSON on stdout, and everything else on stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--json" not in args:
        main(args)
        return
    args.remove("--json")
    sys.stdout.flush()
    figures_out = os.fdopen(os.dup(1), "w")
    # fd 1 itself, not just sys.stdout: the beats, workers and servers a bench starts inherit it.
    os.dup2(2, 1)
    figures = main(args)
    sys.stdout.flush()
    json.dump(figures, figures_out)
    figures_out.write("\n")
    figures_out.close()
