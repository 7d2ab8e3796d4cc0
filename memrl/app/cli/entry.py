"""The `memrl` command's entry point: SIGINT and SIGTERM stop it in one line from its first instant, then the CLI
(`main.main`) runs. Its imports take seconds on a loaded machine; a signal during them is no traceback either."""

from __future__ import annotations

import sys

from memrl.core import interrupts


def main() -> None:
    interrupts.install()
    try:
        from memrl.app.cli.main import main as cli
    except KeyboardInterrupt as exc:
        print(interrupts.line(exc), file=sys.stderr)
        raise SystemExit(interrupts.exit_code(exc)) from None
    cli()
