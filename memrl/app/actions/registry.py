"""Every action, once: the `memrl eval|data` commands and the recipe stage kinds that run them are built from it."""

from __future__ import annotations

from typing import Any

from memrl.app.actions import Action, collab, judger, pahf, tod

ACTIONS: tuple[Action[Any], ...] = (
    collab.EVAL_COLLAB,
    judger.EVAL_JUDGER,
    tod.EVAL_TOD,
    pahf.EVAL_PAHF,
    tod.TOD_DATA,
    tod.JUDGER_DATA,
    pahf.PAHF_DATA,
)
