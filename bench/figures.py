"""How a bench is started from the command line, and how it hands over its figures.

Every bench's ``main(argv)`` prints its table and returns the figures it printed, as data.
``python -m bench.<name> ... --json`` writes those figures to stdout as one JSON document and
sends everything else (the table, the progress lines, whatever the processes it starts print) to
stderr, so a reader (the smoke tests in ``tests/``, a script comparing two commits) parses the
numbers rather than the text.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any


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
