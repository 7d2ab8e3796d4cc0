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

The taxonomy matcher (`PreferenceMatcher`) says which preferences a sentence states: MiniLM similarity to anchor texts,
plus exact word cues. Each preference has four anchors: its description, the rule user's request, its short original
phrase, and one line in the voice of an assistant's note (below). A sentence's similarity to a preference is its best
cosine over that preference's anchors, plus `cue_bonus` when a word cue of the preference occurs in it (MiniLM alone
misses paraphrases such as "TL;DR at the end" often enough to matter). A sentence states every preference whose score is
at least `threshold` and within `margin` of its best one; of two opposite preferences it states only the higher. Scores
are rounded to 3 decimals so tiny float differences between batch shapes never flip a decision.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from memrl.core.asyncs import in_own_thread
from memrl.core.preferences import REQUESTS, TAXONOMY
from memrl.rewards.text import count_words, split_statements
from memrl.rewards.types import JudgeItem, JudgeVerdict
from memrl.rollout.embedding import Embedder, get_embedder

IDS: tuple[str, ...] = tuple(TAXONOMY)

# How an assistant would write each preference into its notes (our words).
NOTE_ANCHORS: dict[str, str] = {
    "direct": "Get straight to the answer with no preamble or filler.",
    "narrative": "Write in a flowing, conversational style that connects ideas and refers back to earlier messages.",
    "polite": "Be warm, friendly and courteous in tone.",
    "blunt": "Be blunt: no pleasantries, apologies or compliments.",
    "analytic": "State assumptions and derive the answer step by step with justification.",
    "intuitive": "Explain the high-level intuition first, then the details.",
    "incremental": "Give one small step per reply and confirm before continuing.",
    "holistic": "Give the full solution at once without splitting it up or asking to continue.",
    "proactive": "Finish every reply by suggesting a next step or follow-up.",
    "no-suggestions": "Answer only what was asked; no unrequested suggestions or next steps.",
    "takeaways": "Summarize the key takeaways at the end of the conversation.",
    "multiple-approaches": "Offer several alternative approaches and compare their pros and cons.",
    "outline-first": "Open with a brief outline of what the answer will cover.",
    "examples": "Illustrate explanations with concrete examples or analogies.",
    "three-sentences": "Keep every reply to three sentences or fewer.",
    "bullets": "Format replies as bullet points.",
    "numbered-steps": "Present solutions as numbered steps.",
    "headings": "Organize replies into sections with headings.",
    "tldr": "End each reply with a one-line TL;DR summary.",
    "confidence": "Say how confident you are in the answer, e.g. as a percentage.",
}

_NEGATION = re.compile(r"\b(no|not|don'?t|doesn'?t|does not|do not|never|without|avoid|skip|stop)\b", re.I)
_CUES: dict[str, str] = {
    "direct": r"to the point|no (preamble|filler|warm-?up|fluff)|skip (the )?(preamble|intro\w*|filler)|"
    r"(lead|open) with the (answer|substance)|\bget directly\b",
    "narrative": r"\bconversational|\bnarrative\b|\bflowing\b|\btransitions?\b|connected prose",
    "polite": r"\bpolite|\bcourteous|\bfriendl(y|ier|iness)|\bwarm(er|th|ly)?\b|\bconsiderate\b",
    "blunt": r"\bblunt|pleasantries|niceties|\bapologi[sz]|\bunvarnished|courtesy phrases",
    "analytic": r"\bassumptions?\b|step[- ]by[- ]step|\bjustif(y|ied|ication)|\bderiv(e|ation)|\brigorous|"
    r"reasoning (steps|chain)|show (the |your )?(work|reasoning)",
    "intuitive": r"big[- ]picture|\bintuiti(on|ve)|high[- ]level|general principle|\boverall (idea|picture)",
    "incremental": r"one (small )?(step|piece|part) (at a time|per (reply|message|answer))|piece by piece|"
    r"step at a time|before moving on|check (with|in with) (me|the user)|\bsmall (steps|pieces|increments?)",
    "holistic": r"(whole|complete|entire|full) (solution|answer|thing)|all at once|in one (reply|go|message|response)",
    "proactive": r"next steps?|follow[- ]up|what to do next|propos(e|ing) (a )?(next|follow)",
    "no-suggestions": r"unsolicited|only what (was|is|i|the user) (asked|requested)|nothing more|"
    r"\b(no|not|without|avoid|don'?t|never)\b[^.;]{0,30}\b(suggestions?|recommendations?|next steps?|extra ideas)",
    "takeaways": r"\btakeaways?\b|\brecap\b|key (points|lessons|ideas)|main (lessons|points)",
    "multiple-approaches": r"\b(multiple|several|different|alternative|more than one|a few|two|three)\b[^.;]{0,12}"
    r"\b(ways|approaches|methods|options|strategies)\b|trade-?offs?|pros and cons|\balternatives\b",
    "outline-first": r"\boutline\b|\broadmap\b|\bplan of\b|overview of what",
    "examples": r"\bexamples?\b|\banalog(y|ies)\b|\bmetaphors?\b",
    "three-sentences": r"\b(three|3) sentences\b",
    "bullets": r"\bbullet",
    "numbered-steps": r"\bnumber(ed)?\b[^.;]{0,20}\bsteps?\b|\bnumber (each|every|the) (step|point)|"
    r"numbered (list|sequence)",
    "headings": r"\b(sub)?headings?\b|\bheaders?\b|section titles?",
    "tldr": r"tl;?\s?dr|(one|single)[- ](line|sentence) (summary|recap)",
    "confidence": r"\bconfiden(t|ce)\b|how (sure|certain)|\bcertainty\b|\d+ ?% (sure|confident|certain)",
}
# A cue of these preferences in a negated sentence more likely states the opposite ("no next steps").
_NEGATION_BLOCKS = frozenset({"proactive", "polite", "examples", "bullets", "headings", "outline-first"})
_CUE_RX = {pid: re.compile(rx, re.I) for pid, rx in _CUES.items()}
_OPPOSITE = {pid: p.opposite for pid, p in TAXONOMY.items() if p.opposite}


def cue_hits(text: str) -> set[str]:
    negated = bool(_NEGATION.search(text))
    return {pid for pid, rx in _CUE_RX.items() if rx.search(text) and not (negated and pid in _NEGATION_BLOCKS)}


def anchors() -> list[tuple[str, str]]:
    """(preference id, anchor text) pairs, four per preference."""
    return [
        (pid, text)
        for pid, p in TAXONOMY.items()
        for text in (p.description, REQUESTS[pid], p.original_key, NOTE_ANCHORS[pid])
    ]


@dataclass(frozen=True)
class MatchParams:
    threshold: float = 0.50  # score a sentence needs to state a preference
    margin: float = 0.03  # other preferences this close to the best one are stated too
    cue_bonus: float = 0.20  # added to the score of a preference whose word cue occurs in the sentence


class PreferenceMatcher:
    """Maps sentences to taxonomy ids; the taxonomy side is embedded once per matcher."""

    def __init__(self, embedder: Embedder, params: MatchParams | None = None) -> None:
        self.embedder = embedder
        self.params = params or MatchParams()

    @cached_property
    def _anchor_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = anchors()
        owner = np.array([IDS.index(pid) for pid, _ in pairs])
        return self.embedder.encode([text for _, text in pairs]), owner

    def scores(self, vectors: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 20) scores: best anchor cosine per preference, plus the cue bonus."""
        matrix, owner = self._anchor_matrix
        sims = vectors @ matrix.T
        out = np.full((len(texts), len(IDS)), -1.0, dtype=np.float64)
        for j in range(len(IDS)):
            out[:, j] = sims[:, owner == j].max(axis=1) if len(texts) else 0.0
        for i, text in enumerate(texts):
            for pid in cue_hits(text):
                out[i, IDS.index(pid)] += self.params.cue_bonus
        return np.round(out, 3)

    def stated(self, scores: np.ndarray) -> list[dict[str, float]]:
        """Per sentence: the preferences it states, with their scores."""
        p = self.params
        out: list[dict[str, float]] = []
        for row in scores:
            best = float(row.max()) if row.size else 0.0
            hits = {IDS[j]: float(row[j]) for j in np.nonzero((row >= p.threshold) & (row >= best - p.margin))[0]}
            for pid in list(hits):
                rival = _OPPOSITE.get(pid)
                if rival in hits and pid in hits:
                    del hits[pid if hits[pid] < hits[rival] or (hits[pid] == hits[rival] and pid > rival) else rival]
            out.append(hits)
        return out

    def match(self, texts: Sequence[str]) -> list[dict[str, float]]:
        """Embed `texts` (one batched call) and return the preferences each states."""
        return self.stated(self.scores(self.embedder.encode(texts), texts))


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
