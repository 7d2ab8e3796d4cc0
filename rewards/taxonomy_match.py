"""Which taxonomy preferences a sentence states: MiniLM similarity to anchor texts, plus exact word cues.

Each preference has four anchors: its description, the rule user's request, its short original phrase, and one
line in the voice of an assistant's note (below). A sentence's similarity to a preference is its best cosine over
that preference's anchors, plus `cue_bonus` when a word cue of the preference occurs in it (MiniLM alone misses
paraphrases such as "TL;DR at the end" often enough to matter). A sentence states every preference whose score
is at least `threshold` and within `margin` of its best one; of two opposite preferences it states only the
higher. Scores are rounded to 3 decimals so tiny float differences between batch shapes never flip a decision.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from memrl.core.preferences import REQUESTS, TAXONOMY
from memrl.rollout.embedding import Embedder

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
