"""Metrics of an MS-TOD evaluation, per session and over a run.

A slot counts as correct in a response when the response states the slot's goal value, decided by normalised
string matching (`mentions`): the same test for the template and the LLM reader, and the one the rule supervisor
uses. Per session: `jga` (every goal slot correct in the confirmation response), `slot_accuracy`, `dte` (assistant
turns until the task is complete, the confirmation being turn 1; the turn limit when it never completes),
`success` (every slot resolved within the limit) and recall of the gold memory in the pipeline's fused ranking:
`recall@k` over the distinct gold (slot, value) facts, `pair_recall@k` over the gold pairs, and the `ceiling_`
of each, the best any ranking of the session's memory reaches (`envs.tod.ranking`); the same recalls of retrieval
alone and of the judger alone carry a `retrieval_` / `judger_` prefix, and `judger_gain@5` is fused minus retrieval.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import fmean
from typing import Any

from memrl.envs.tod.formats import Session, Turn, as_dicts
from memrl.envs.tod.labels import label
from memrl.envs.tod.memory import MemoryUnit
from memrl.envs.tod.pipeline import candidate_key
from memrl.envs.tod.prompts import QUALITY_KEYS, quality_messages
from memrl.envs.tod.ranking import GAIN_K, Facts, RankedQuery, fact_of, gain_interval, judger_gain, recall_names
from memrl.envs.tod.reasoning import filled_slots
from memrl.envs.tod.records import TodSessionRecord
from memrl.envs.tod.values import mentions
from memrl.rollout.base import ChatBackend, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, parse_json_object

RECALL_KS = (1, 3, 5)
_RECALL_KEYS = [*recall_names(RECALL_KS), *(f"ceiling_{name}" for name in recall_names(RECALL_KS))]
ALONE = ("retrieval", "judger")  # the single-score rankings scored beside the fused one


def slot_correctness(response: str, goal: Mapping[str, str]) -> dict[str, bool]:
    """Goal slot -> whether the response states its goal value."""
    return {slot: mentions(response, value) for slot, value in goal.items()}


def outstanding_slots(response: str, goal: Mapping[str, str]) -> list[str]:
    """L: the goal slots a response leaves missing or gets wrong, in goal order."""
    return [slot for slot, ok in slot_correctness(response, goal).items() if not ok]


def recall_scores(
    ranked: Sequence[str], gold: Iterable[str], facts: Facts | None = None, candidates: Collection[str] | None = None
) -> dict[str, float | None]:
    """`recall@k`, `pair_recall@k` and their `ceiling_` for the `RECALL_KS`; None for a session without gold memory
    (left out of the means). `facts` maps pair keys to `fact_of(slot, answer)` (a key without one is its own fact);
    `candidates` are the keys of every stored pair (None: the gold ones at least)."""
    query = RankedQuery(ranked, set(gold), facts or {}, candidates)
    scores = query.recalls(RECALL_KS) | query.ceilings(RECALL_KS)
    return {name: None if math.isnan(value) else value for name, value in scores.items()}


def session_scores(
    confirmation: str,
    goal: Mapping[str, str],
    dte: int,
    success: bool,
    ranked: Sequence[str],
    gold: Iterable[str],
    facts: Facts | None = None,
    candidates: Collection[str] | None = None,
    rankings: Mapping[str, Sequence[str] | None] | None = None,
) -> dict[str, Any]:
    """The per-session numbers a session record carries. `rankings` (`Selection.rankings`): the retrieval-alone and
    judger-alone orders, scored as `retrieval_recall@k` ...; a None order (no judger) gives None values."""
    correct = slot_correctness(confirmation, goal)
    gold = sorted(set(gold))
    alone: dict[str, float | None] = {}
    for name, order in (rankings or {}).items():
        if name not in ALONE:
            raise ValueError(f"unknown ranking {name!r}; expected one of {', '.join(ALONE)}")
        recalls = recall_scores(order or [], gold, facts, candidates)
        alone |= {f"{name}_{k}": None if order is None else recalls[k] for k in recall_names(RECALL_KS)}
    return {
        "jga": float(all(correct.values())),
        "slot_accuracy": sum(correct.values()) / len(correct) if correct else 1.0,
        "correct_slots": correct,
        "dte": dte,
        "success": success,
        **recall_scores(ranked, gold, facts, candidates),
        **alone,
    }


def _with_fact_recall(record: TodSessionRecord) -> TodSessionRecord:
    """A record written before `recall@k` counted distinct facts (its `recall@k` is the pair figure), scored again
    from what it kept: the ranked pairs with slot and answer, the gold keys (.../slot) and the goal. Gold pairs hold
    the goal value, and the kept top of the ranking is longer than the largest k."""
    if "pair_recall@1" in record.recalls:
        return record
    facts = {p["key"]: fact_of(p["slot"], p["answer"]) for p in record.ranked}
    for key in record.gold:
        slot = key.rsplit("/", 1)[-1]
        facts[key] = fact_of(slot, record.goal.get(slot, ""))
    again = recall_scores([p["key"] for p in record.ranked], record.gold, facts)
    return replace(record, recalls=record.recalls | again)


def _with_alone_recall(record: TodSessionRecord) -> TodSessionRecord:
    """A record written before the single-score rankings were kept: without a judger its ranking was retrieval's
    (`final` is s_pre), so that column is its fused recall; with one, nothing says what retrieval alone would do."""
    recalls = record.recalls
    if (
        f"retrieval_recall@{GAIN_K}" in recalls
        or not record.ranked
        or any(p.get("judger") is not None for p in record.ranked)
    ):
        return record
    names = recall_names(RECALL_KS)
    alone = {f"retrieval_{k}": recalls.get(k) for k in names} | {f"judger_{k}": None for k in names}
    return replace(record, recalls=recalls | alone)


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(fmean(kept), 4) if kept else None


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def compute_metrics(records: Sequence[TodSessionRecord]) -> dict[str, Any]:
    """Means over sessions; `slot_accuracy` is over every goal slot of every session (micro average)."""
    if not records:
        return {"sessions": 0}
    records = [_with_alone_recall(_with_fact_recall(r)) for r in records]
    slots = [ok for r in records for ok in r.correct_slots.values()]
    failures: dict[str, int] = defaultdict(int)
    for r in records:
        for role, n in r.failures.items():
            failures[role] += n
    with_gold = [r for r in records if r.gold]
    # Records of a run resumed from before the retrieval/judger rankings were kept have only the fused figures: the
    # single-score columns cover the records that have them, and the gain compares like with like.
    ranked_alone = [r.recalls for r in with_gold if f"retrieval_recall@{GAIN_K}" in r.recalls]
    alone = {
        f"{name}_{key}": _mean(r.get(f"{name}_{key}") for r in ranked_alone)
        for name in ALONE
        for key in recall_names(RECALL_KS)
    }
    paired = {
        f"recall@{GAIN_K}": _mean(r[f"recall@{GAIN_K}"] for r in ranked_alone),
        f"retrieval_recall@{GAIN_K}": alone[f"retrieval_recall@{GAIN_K}"],
    }
    judged = any(r.get(f"judger_recall@{GAIN_K}") is not None for r in ranked_alone)
    out: dict[str, Any] = {
        "jga": _mean(r.jga for r in records),
        "slot_accuracy": round(sum(slots) / len(slots), 4) if slots else None,
        "dte": _mean(r.dte for r in records),
        "success_rate": _mean(float(r.success) for r in records),
        **{name: _mean(r.recalls.get(name) for r in with_gold) for name in _RECALL_KEYS},
        **alone,
        f"judger_gain@{GAIN_K}": judger_gain(paired) if judged else None,
        f"judger_gain@{GAIN_K}_interval": (
            gain_interval(
                [_nan(r[f"recall@{GAIN_K}"]) for r in ranked_alone],
                [_nan(r.get(f"retrieval_recall@{GAIN_K}")) for r in ranked_alone],
            )
            if judged
            else None
        ),
        "sessions": len(records),
        "sessions_with_gold": len(with_gold),
        "sessions_without_rankings": len(with_gold) - len(ranked_alone),
        "individuals": len({r.persona_id for r in records}),
        "failures": dict(sorted(failures.items())),
    }
    scored = [r.quality for r in records if r.quality is not None]
    if any(r.rated for r in records):
        out["quality"] = _mean(scored)
        out["quality_scored"] = len(scored)
    return out


# --- gold memory and the optional quality judge -------------------------------------------------------------------


def gold_memory(
    persona_id: int, session: Session, context: Sequence[Turn], goal: Mapping[str, str], units: Sequence[MemoryUnit]
) -> list[str]:
    """Keys of the QA pairs that should be recalled: the positives of the judger data for this session.

    A pair is gold when it comes from the same task, its slot is a goal slot the context does not fill, and its
    answer is the confirmed value (a superseded, earlier value is not); `labels.label` decides.
    """
    filled = filled_slots(context, goal)
    return [
        candidate_key(persona_id, session.session_id, unit, qa.slot)
        for unit in units
        for qa in unit.qa
        if label(session, goal, filled, unit.reference_dialogue_id, unit.intent, qa.slot, qa.answer) is None
    ]


@dataclass(frozen=True)
class QualityJudge:
    """An LLM rates the confirmation response 1-10 (fluency, coherence, informativeness); None when unusable."""

    backend: ChatBackend
    sampling: SamplingParams

    async def rate(self, context: Sequence[Turn], goal: Mapping[str, str], response: str) -> int | None:
        raw = (await self.backend.achat(quality_messages(as_dicts(context), goal, response), self.sampling)).text
        return parse_quality(raw)


def parse_quality(raw: str) -> int | None:
    """The judge's 1-10 score; None when the reply has no usable score."""
    parsed = parse_json_object(raw, required=QUALITY_KEYS)
    if isinstance(parsed, JSONParseFailure):
        return None
    try:
        value = float(parsed.data["score"])
    except (TypeError, ValueError):
        return None
    return round(value) if math.isfinite(value) and 1 <= round(value) <= 10 else None
