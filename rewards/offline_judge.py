"""Deterministic coverage judge for CPU runs and tests: no LLM, the taxonomy and MiniLM only.

Algorithm (docs/rewards.md has the rationale and the thresholds):
1. Expected preferences: `truth.expected` when given, else the taxonomy ids the enforcing utterances state (each
   utterance cut into sentences and matched like a note), else the ids the gold notes state.
2. The notes are cut into statements (lines, bullets, sentences); each statement is matched to the taxonomy.
3. covered = expected ids some statement states; missing = the rest; hallucinated = stated ids not expected.
4. score = 3 * covered / expected - hallucination_cost per hallucinated id - a padding penalty (statements that
   state nothing, or repeat a preference more than `repeats_allowed` times, beyond a free allowance) - an
   over-length penalty (words beyond a budget that grows with the number of expected ids); clipped to [0, 3].
   Empty notes score 0 (3 when nothing was expected).
All texts of a batch are embedded in one call; vectors of texts seen before come from the embedder's cache.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from memrl.core.asyncs import in_own_thread
from memrl.rewards.taxonomy_match import IDS, MatchParams, PreferenceMatcher
from memrl.rewards.text import count_words, split_statements
from memrl.rewards.types import JudgeItem, JudgeVerdict
from memrl.rollout.embedding import get_embedder


@dataclass(frozen=True)
class OfflineJudgeParams:
    match: MatchParams = field(default_factory=MatchParams)
    hallucination_cost: float = 0.75  # points (of 3) per stated preference that was not expected
    padding_cost: float = 0.25  # points per padding statement beyond the free allowance
    max_padding_penalty: float = 1.5
    repeats_allowed: int = 2  # statements per preference before more of them count as padding
    free_padding: int = 2  # padding statements allowed for free (at least one per expected id)
    words_base: int = 30  # word budget = words_base + words_per_preference * expected ids
    words_per_preference: int = 30
    overlength_cost: float = 0.5  # points per budget-length over the budget
    max_overlength_penalty: float = 1.0


def _names(ids: Sequence[str]) -> str:
    return ", ".join(ids) if ids else "none"


def _in_taxonomy_order(ids: set[str]) -> tuple[str, ...]:
    return tuple(pid for pid in IDS if pid in ids)


class OfflineJudge:
    """The 0-3 rubric, approximated: coverage of the expected preferences, no invented ones, concise notes."""

    reports_ids = True

    def __init__(
        self,
        embedding_model: str = "all-minilm-l6-v2",
        params: OfflineJudgeParams | None = None,
        matcher: PreferenceMatcher | None = None,
    ) -> None:
        self.params = params or OfflineJudgeParams()
        self.name = f"offline:{embedding_model}"
        self.matcher = matcher or PreferenceMatcher(get_embedder(embedding_model), self.params.match)

    async def score_many(self, items: Sequence[JudgeItem]) -> list[JudgeVerdict | None]:
        # The encoder is CPU-bound: keep it off the event loop so other reward work (and verl's loop) proceeds.
        return list(await in_own_thread(self.score_many_sync, items))

    def score_many_sync(self, items: Sequence[JudgeItem]) -> list[JudgeVerdict]:
        notes = [split_statements(item.notes) for item in items]
        enforced = [
            [] if item.truth.expected else [s for u in item.truth.enforcements for s in (split_statements(u) or [u])]
            for item in items
        ]
        stated = self._match([*notes, *enforced])
        expected = [
            self._expected(item, [stated[u] for u in utterances])
            for item, utterances in zip(items, enforced, strict=True)
        ]
        # Gold notes matter only where neither the data nor the enforcements name a preference: embed those alone.
        gold = [
            split_statements(item.truth.gold_notes) if not ids else []
            for item, (ids, _) in zip(items, expected, strict=True)
        ]
        if any(gold):
            stated |= self._match(gold)
            expected = [
                ({pid for g in lines for pid in stated[g]}, "from the gold notes") if lines else found
                for lines, found in zip(gold, expected, strict=True)
            ]
        return [
            self._grade(item.notes, [stated[s] for s in statements], ids, source)
            for item, statements, (ids, source) in zip(items, notes, expected, strict=True)
        ]

    def _match(self, groups: Sequence[Sequence[str]]) -> dict[str, dict[str, float]]:
        texts = list(dict.fromkeys(t for group in groups for t in group))
        return dict(zip(texts, self.matcher.match(texts), strict=True))

    @staticmethod
    def _expected(item: JudgeItem, utterance_hits: list[dict[str, float]]) -> tuple[set[str], str]:
        if item.truth.expected:
            return set(item.truth.expected), "given"
        return {pid for hits in utterance_hits for pid in hits}, "from the enforcing utterances"

    def _grade(self, notes: str, hits: list[dict[str, float]], expected: set[str], source: str) -> JudgeVerdict:
        p = self.params
        want = _in_taxonomy_order(expected)
        if not hits:
            score = 0.0 if expected else 3.0
            why = "no statements in the notes" + (f"; expected ({source}): {_names(want)}" if expected else "")
            return JudgeVerdict(score, f"{why} -> {score:.2f}", (), want, ())
        counts = Counter(pid for h in hits for pid in h)
        stated = set(counts)
        covered, missing = _in_taxonomy_order(expected & stated), _in_taxonomy_order(expected - stated)
        hallucinated = _in_taxonomy_order(stated - expected)
        unmatched = sum(1 for h in hits if not h)
        padding = unmatched + sum(max(0, n - p.repeats_allowed) for n in counts.values())
        pad_penalty = min(p.max_padding_penalty, p.padding_cost * max(0, padding - max(p.free_padding, len(want))))
        words = count_words(notes)
        budget = p.words_base + p.words_per_preference * max(1, len(want))
        long_penalty = min(p.max_overlength_penalty, p.overlength_cost * max(0.0, words / budget - 1.0))
        base = 3.0 * len(covered) / len(want) if want else 3.0
        raw = base - p.hallucination_cost * len(hallucinated) - pad_penalty - long_penalty
        score = round(min(3.0, max(0.0, raw)), 2)
        reasoning = (
            f"covered {len(covered)}/{len(want)} expected ({source}): {_names(covered)}; missing: {_names(missing)}; "
            f"stated but not expected: {_names(hallucinated)}; {unmatched}/{len(hits)} statements state no "
            f"preference, padding penalty {pad_penalty:.2f}; {words} words for a budget of {budget}, length "
            f"penalty {long_penalty:.2f} -> {score:.2f}"
        )
        return JudgeVerdict(score, reasoning, covered, missing, hallucinated)
