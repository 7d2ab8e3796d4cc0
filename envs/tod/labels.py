"""Which stored QA pairs a confirming session needs: the relevance label the judger learns and recall is scored on.

A pair is relevant when it belongs to the same task, its slot is a goal slot the context has not filled, and its
answer is the value the task finally confirmed. Every irrelevant pair says why:
- `same_intent`: another task with the same intent (the hard negatives),
- `other_intent`: a task with another intent,
- `filled`: the same task, but the context already states that slot,
- `superseded`: the same task and slot, but a value the user later changed (`values.same_value` compares),
- `off_goal`: the same task, a slot outside its goal (only from model-built memory).
"""

from __future__ import annotations

from collections.abc import Mapping

from memrl.envs.tod.formats import Session
from memrl.envs.tod.values import same_value

NEGATIVE_KINDS = ("same_intent", "other_intent", "filled", "superseded", "off_goal")


def label(
    query: Session,
    goal: Mapping[str, str],
    filled: Mapping[str, str],
    unit_task: str,
    unit_intent: str,
    slot: str,
    answer: str,
) -> str | None:
    """None for a positive, else the negative's kind: a pair of task `unit_task` (intent `unit_intent`) against the
    query session, its confirmed `goal` and the slots its context has `filled`."""
    if unit_task != query.reference_dialogue_id:
        return "same_intent" if unit_intent == query.intent else "other_intent"
    if slot not in goal:
        return "off_goal"
    if not same_value(answer, goal[slot]):
        return "superseded"
    return "filled" if slot in filled else None
