"""How well the offline judge agrees with an LLM judge: both grade the same notes; Pearson and Spearman.

`reference_items()` is a small hand-written set (20 notes over 4 sessions: faithful, paraphrased, partial,
padded, over-complete and irrelevant notes) for a quick check of any LLM judge; pass your own items for more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from memrl.core.preferences import TAXONOMY
from memrl.rewards.judge import Judge
from memrl.rewards.types import GroundTruth, JudgeItem


def pearson(x: ArrayLike, y: ArrayLike) -> float | None:
    """None when either side is constant (the correlation is undefined)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties sharing their average rank."""
    order = values.argsort(kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    ranks[order] = np.arange(len(values), dtype=float)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float | None:
    return pearson(_ranks(np.asarray(x, dtype=float)), _ranks(np.asarray(y, dtype=float)))


@dataclass(frozen=True)
class Agreement:
    n: int  # items both judges graded
    failures: int  # items the LLM judge gave no verdict for (left out of the correlations)
    pearson: float | None
    spearman: float | None
    offline: tuple[float | None, ...]
    llm: tuple[float | None, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "n": self.n,
            "failures": self.failures,
            "pearson": self.pearson,
            "spearman": self.spearman,
            "offline": list(self.offline),
            "llm": list(self.llm),
        }


async def measure_agreement(items: Sequence[JudgeItem], offline: Judge, llm: Judge) -> Agreement:
    a = [v.score if v else None for v in await offline.score_many(items)]
    b = [v.score if v else None for v in await llm.score_many(items)]
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    return Agreement(len(pairs), sum(y is None for y in b), pearson(xs, ys), spearman(xs, ys), tuple(a), tuple(b))


_ALL = "\n".join(f"- {p.description}" for p in TAXONOMY.values())
_SESSIONS: dict[str, tuple[str, ...]] = {
    "format": ("Hold on. Put that in bullet points.", "Wait. End with a one-line TL;DR."),
    "short": (
        "Keep replies to three sentences at most.",
        "Tell me how confident you are in that answer.",
        "Include an example or an analogy, please.",
    ),
    "rigour": ("State your assumptions and show each reasoning step before the conclusion.",),
    "plain": ("Answer only what I asked, without extra suggestions or next steps.", "Use a heading for each section."),
}
_NOTES: tuple[tuple[str, str], ...] = (
    ("format", "- Format every answer as a bullet list.\n- End each reply with a one-line TL;DR summary."),
    ("format", "The user wants bulleted answers, and a single-line TL;DR at the very end of each reply."),
    ("format", "- Use bullet points for answers."),
    ("format", "- Use bullet points.\n- End with a TL;DR line.\n- Keep replies to three sentences.\n- Be polite."),
    ("format", _ALL),
    (
        "short",
        "- Keep every reply to three sentences or fewer.\n- State a confidence level (e.g. 80%) with each answer.\n"
        "- Explain with a concrete example or analogy.",
    ),
    ("short", "- Replies: max three sentences.\n- Give a worked example."),
    ("short", "- Be brief.\n- The user asked about probability; the final answer was 3/8."),
    (
        "short",
        "- At most three sentences per reply.\n- Say how sure you are.\n- Use examples.\n- The user liked the "
        "session.\n- We discussed dice.\n- The answer was 3/8.\n- The user is a student.\n- Double-check sums.",
    ),
    ("short", ""),
    ("rigour", "- Before answering, list the assumptions and derive the result one justified step at a time."),
    ("rigour", "- Show your reasoning step by step.\n- Number each step.\n- Add headings."),
    ("rigour", "The user solved a logic puzzle about knights and knaves. The answer was that A is a knave."),
    ("rigour", _ALL),
    ("rigour", "- Explain the big picture before the details."),
    (
        "plain",
        "- Answer exactly the question; never add unrequested suggestions or next steps.\n"
        "- Split replies into sections, each under a heading.",
    ),
    ("plain", "- Put each section under its own heading."),
    ("plain", "- Always end with a suggested next step.\n- Use headings."),
    ("plain", "- Do only what is asked.\n- Use headings.\n- Include an example.\n- Give a TL;DR.\n- Be friendly."),
    ("plain", "We talked about a chemistry question and the user seemed satisfied."),
)


def reference_items() -> list[JudgeItem]:
    return [JudgeItem(notes, GroundTruth(_SESSIONS[session])) for session, notes in _NOTES]
