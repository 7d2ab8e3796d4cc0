"""`memrl eval`: the commands generated from the registry's evaluation actions and the hand-written `eval reflector`."""

from __future__ import annotations

import typer

from memrl.app.cli import commands
from memrl.app.cli.reflector import eval_reflector

eval_app = typer.Typer(no_args_is_help=True)
# `eval reflector` stays hand-written: one model and judge flags here, a table of models and a reward section in
# its stage `eval_reflector`, whose run also writes the recipe's report.
commands.install(eval_app, "eval", {"reflector": eval_reflector})
