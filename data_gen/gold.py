"""The composed gold reflection: notes and reasoning written from the enforced preference ids, no model involved.

Each taxonomy preference maps to one note line that tells the agent what to do and when it applies (written for
the agent, in our own words), and to a short label the reasoning uses to name it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from memrl.rewards.format import REFLECTION_KEYS


@dataclass(frozen=True)
class NoteSpec:
    label: str  # how the reasoning names the preference
    action: str  # what the agent should do
    when: str  # when it applies

    def line(self) -> str:
        return f"- {self.action} Applies: {self.when}."


NOTES: dict[str, NoteSpec] = {
    "direct": NoteSpec(
        "answers that go straight to the point",
        "Open with the substance itself; no warm-up, no praise of the question, no announcing what comes next.",
        "every reply",
    ),
    "narrative": NoteSpec(
        "a conversational style that links ideas",
        "Write flowing prose that picks up what the user just said and bridges from one idea to the next; "
        "avoid bare, clipped lists.",
        "every reply",
    ),
    "polite": NoteSpec(
        "a more courteous tone",
        "Sound warm and considerate, with some friendly, courteous wording.",
        "every reply",
    ),
    "blunt": NoteSpec(
        "blunt replies without pleasantries",
        "Be plain and unvarnished: no pleasantries, apologies, thanks or flattery.",
        "every reply",
    ),
    "analytic": NoteSpec(
        "step-by-step reasoning from stated assumptions",
        "State the assumptions, derive the result one step at a time and justify each conclusion.",
        "whenever solving a problem or explaining a concept",
    ),
    "intuitive": NoteSpec(
        "the big picture before the details",
        "Give the overall idea and the general principle first; formulas and specifics only after that.",
        "whenever solving a problem or explaining a concept",
    ),
    "incremental": NoteSpec(
        "one small step at a time",
        "Give one small piece per reply and check that the user is ready before moving to the next.",
        "problems with several steps",
    ),
    "holistic": NoteSpec(
        "the whole solution at once",
        "Give the complete solution in a single reply; do not split it up or keep asking whether to continue.",
        "every answer",
    ),
    "proactive": NoteSpec(
        "a suggested next step at the end",
        "Finish by proposing a concrete follow-up action or next step.",
        "every answer, even a complete one",
    ),
    "no-suggestions": NoteSpec(
        "answers without unrequested suggestions",
        "Do exactly what was asked; volunteer no recommendations, extra ideas or next steps.",
        "every reply",
    ),
    "takeaways": NoteSpec(
        "a recap of the key takeaways",
        "Sum up the key takeaways for the user to keep.",
        "when the conversation is wrapping up",
    ),
    "multiple-approaches": NoteSpec(
        "several approaches with their trade-offs",
        "Offer more than one workable approach, each with its pros and cons.",
        "whenever giving an answer",
    ),
    "outline-first": NoteSpec(
        "an outline before the content",
        "Open with a short outline of what the reply will cover.",
        "whenever giving an answer",
    ),
    "examples": NoteSpec(
        "examples or analogies",
        "Include a concrete example, comparison or analogy.",
        "whenever explaining something",
    ),
    "three-sentences": NoteSpec(
        "replies of three sentences at most",
        "Keep the reply to three sentences or fewer.",
        "every reply",
    ),
    "bullets": NoteSpec(
        "bullet points",
        "Lay the reply out as a bullet list (lines starting with '-'); a little prose around it is fine.",
        "every reply",
    ),
    "numbered-steps": NoteSpec(
        "numbered steps",
        "Organise the reply as a sequence of numbered steps (1., 2., 3., ...).",
        "every reply",
    ),
    "headings": NoteSpec(
        "a heading for each section",
        "Split the reply into sections, each under its own heading.",
        "every reply",
    ),
    "tldr": NoteSpec(
        "a one-line TL;DR at the end",
        "Close with a single-line TL;DR.",
        "every reply",
    ),
    "confidence": NoteSpec(
        "a confidence estimate",
        "Say how confident you are in the answer, for example as a percentage.",
        "whenever giving an answer",
    ),
}


def compose_notes(expected: Sequence[str]) -> str:
    """One note line per preference id, in the given order ("" when there is none)."""
    return "\n".join(NOTES[pid].line() for pid in expected)


def _listing(ids: Sequence[str]) -> str:
    labels = [NOTES[pid].label for pid in ids]
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def compose_reasoning(enforced: Sequence[str], carried: Sequence[str]) -> str:
    """One sentence: what the user asked for in this session (new or again) and which earlier notes stay."""
    new = [pid for pid in enforced if pid not in carried]
    again = [pid for pid in enforced if pid in carried]
    rest = [pid for pid in carried if pid not in enforced]
    parts = [f"the user asked for {_listing(new)}"] if new else []
    if again:
        parts.append(f"{'asked' if new else 'the user asked'} again for {_listing(again)}, already in the notes")
    if not enforced:
        parts.append("the user asked for no change")
    if rest:
        parts.append(f"the notes keep {_listing(rest)} from earlier sessions")
    elif not carried:
        parts.append("there were no earlier notes")
    return "In this session " + "; ".join(parts) + "."


def gold_json(reasoning: str, notes: str) -> str:
    """The assistant target: the reflection prompt's JSON contract, compact, one object."""
    reasoning_key, notes_key = REFLECTION_KEYS
    return json.dumps({reasoning_key: reasoning, notes_key: notes}, ensure_ascii=False, separators=(",", ":"))
