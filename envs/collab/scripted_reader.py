"""A note reader without a model: the next-session agent of CPU runs (`reward.outcome.agent: scripted`).

It reads the notes one sentence at a time with word rules of its own, turns what they ask for into reply habits, and
writes every reply from those habits alone; with no notes it keeps a chatty default that some users object to. So
the next session measures the notes and nothing else, deterministically, in microseconds.

It shares nothing with the coverage judge that writes the reflection reward (`memrl.rewards`: no anchors, cue
lists, thresholds or embeddings; `tests/envs/test_scripted_reader.py` checks the imports and the word lists): two
signals built apart can disagree, which is what makes the next session a check on the judge rather than its echo.
Its rules read imperative notes ("Use bullet points."), descriptions of the user ("prefers blunt answers") and
prohibitions ("no pleasantries", "never suggest next steps"); a sentence about what the user objects to ("Object
when ...", "dislikes ...") is read as the habit to drop, not the one to take up.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memrl.rollout.base import Message

NAME = "scripted"


def _words(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)


# A sentence that describes what to avoid: its habits are dropped, except the few rules written for prohibitions.
_AGAINST = _words(r"^\W*(?:object|objects|avoid|never|don't|do not|no longer)\b", r"\b(?:dislikes?|hates?|annoy)")

# habit -> the wording that asks for it in a sentence that is not against something
_ASKS: dict[str, re.Pattern[str]] = {
    "direct": _words(
        r"straight to the point",
        r"\bget to the point",
        r"\bto the point\b",
        r"\bopen(?:s|ing)? with the (?:substance|answer)",
        r"\bno (?:warm-?up|preamble|intro|filler|fluff)",
        r"\bwithout (?:warm-?up|preamble|filler|fluff)",
        r"\bskip (?:the )?(?:preamble|intro|warm-?up)",
        r"\bdirect(?:ly)? (?:answers?|replies)",
        r"\bbe direct\b",
    ),
    "narrative": _words(
        r"\bconversational\b", r"\bflowing\b", r"\bnarrative\b", r"\btransitions?\b", r"\bconnected prose"
    ),
    "polite": _words(
        r"\bpolite", r"\bcourteous", r"\bwarm(?:th|ly)?\b(?!-)", r"\bfriendl(?:y|ier|iness)", r"\bconsiderate\b"
    ),
    "blunt": _words(
        r"\bblunt",
        r"\bunvarnished\b",
        r"\bno (?:niceties|pleasantries|courtesy|apolog|thanks|flattery|small talk)",
        r"\bwithout (?:niceties|pleasantries|courtesy|apolog|flattery)",
        r"\bskip (?:the )?(?:niceties|pleasantries)",
    ),
    "analytic": _words(
        r"\bassumptions?\b",
        r"\bjustif(?:y|ied|ies)",
        r"\bderiv(?:e|ation|ing)",
        r"\breasoning\b",
        r"\bstep[- ]by[- ]step",
        r"\bshow (?:the|your|each) (?:work|steps?|logic)",
    ),
    "intuitive": _words(
        r"\bbig[- ]picture", r"\bintuiti(?:on|ve)", r"\boverall (?:idea|picture)", r"\bgeneral principle"
    ),
    "incremental": _words(
        r"\bone (?:small )?(?:piece|part|chunk) (?:at a time|per reply|per message)",
        r"\bpiece by piece",
        r"\bone (?:small )?step (?:per reply|per message)",
        r"\bsmall (?:pieces|increments|chunks)",
        r"\bcheck (?:in|with (?:me|the user)|that (?:the user|they) (?:is|are) ready)",
    ),
    "holistic": _words(
        r"\b(?:complete|whole|full|entire) (?:solution|answer|thing)",
        r"\ball at once\b",
        r"\bin (?:a single|one) (?:reply|response|message|go)\b",
    ),
    "proactive": _words(
        r"\bnext steps?\b",
        r"\bfollow-?up",
        r"\bsuggest(?:s|ion|ions|ing)?\b",
        r"\bpropos(?:e|ing)\b",
        r"\bwhat to do next",
    ),
    "no-suggestions": _words(
        r"\bexactly what (?:was|is|i|you|they|the user) ask",
        r"\bnothing (?:more|else|extra)\b",
        r"\bonly what (?:was|is|i|they|the user) ask",
        r"\bno (?:unrequested|unsolicited|extra) ",
        r"\bvolunteer no\b",
        r"\bwithout (?:extra|unrequested|unsolicited) (?:suggestions|ideas|advice)",
    ),
    "takeaways": _words(r"\btakeaways?\b", r"\brecap\b", r"\bsum (?:it )?up\b", r"\bsummari[sz]e\b", r"\bkey points\b"),
    "multiple-approaches": _words(
        r"\b(?:several|multiple|two|different|alternative|more than one) (?:\w+ )?"
        r"(?:ways|approaches|methods|options|solutions)",
        r"\bpros and cons\b",
        r"\btrade-?offs?\b",
        r"\balternatives\b",
    ),
    "outline-first": _words(
        r"\boutline\b",
        r"\broadmap\b",
        r"\b(?:a|short|brief) plan of what",
        r"\bwhat (?:it|the reply|you) will cover",
        r"\blay(?:ing)? out (?:the|a|that) plan",
    ),
    "examples": _words(
        r"\b(?:concrete|worked|real|an) examples?\b",
        r"\bexamples?,",
        r"\banalog(?:y|ies)\b",
        r"\bcomparisons?\b",
        r"\b(?:give|use|include|with) examples\b",
    ),
    "three-sentences": _words(
        r"\b(?:three|3) sentences",
        r"\bat most (?:three|3)\b",
        r"\bno more than (?:three|3)\b",
        r"\b(?:very )?short replies",
    ),
    "bullets": _words(r"\bbullet", r"\bbulleted\b", r"\blines starting with '?-"),
    "numbered-steps": _words(r"\bnumbered\b", r"\bnumber (?:the|each|every|its) ", r"\beach with its number"),
    "headings": _words(r"\bheadings?\b", r"\bheaders?\b", r"\bsection titles?\b", r"\btitled sections\b"),
    "tldr": _words(r"\btl;?\s?dr\b", r"\bone-line summary\b", r"\bbottom line\b"),
    "confidence": _words(r"\bconfiden(?:t|ce)\b", r"\bhow (?:sure|certain)\b", r"\bcertainty\b"),
}

# Rules written for prohibitions: what "no X" / "never X" asks for. Read in every sentence.
_FORBIDS: dict[str, re.Pattern[str]] = {
    "no-suggestions": _words(
        r"\b(?:no|never|don't|do not|without)\b[^.;]{0,30}\b(?:suggest|recommend|next steps?|extra ideas)",
        r"\bvolunteers?\b[^.;]{0,30}\b(?:recommendations|suggestions|ideas|next steps)",
    ),
    "blunt": _words(
        r"\b(?:no|never|don't|do not|without)\b[^.;]{0,20}\b(?:niceties|pleasantries|apolog|thank|flatter)"
    ),
    "direct": _words(r"\b(?:no|never|don't|do not|without)\b[^.;]{0,20}\b(?:warm-?up|preamble|filler|praise)"),
    "holistic": _words(r"\b(?:don't|do not|never)\b[^.;]{0,20}\b(?:split|stop|keep asking)"),
}

# At most one habit of each pair: a note that asks for both is read as the one named first.
_EXCLUSIVE = (
    ("direct", "narrative"),
    ("polite", "blunt"),
    ("analytic", "intuitive"),
    ("incremental", "holistic"),
    ("proactive", "no-suggestions"),
    ("bullets", "numbered-steps"),
)


def _sentences(notes: str) -> list[str]:
    parts = re.split(r"(?<=[.!?;])\s+|\n+", notes)
    return [p.strip(" -*•\t") for p in parts if re.search(r"[a-z]", p, re.IGNORECASE)]


def read_habits(notes: str) -> frozenset[str]:
    """The reply habits the notes ask for (preference ids), in the reader's own reading."""
    found: list[str] = []
    for sentence in _sentences(notes):
        against = bool(_AGAINST.search(sentence))
        for habit, rule in _FORBIDS.items():
            if rule.search(sentence):
                found.append(habit)
        if against:
            continue
        for habit, rule in _ASKS.items():
            if rule.search(sentence) and not (habit == "proactive" and _FORBIDS["no-suggestions"].search(sentence)):
                found.append(habit)
    kept = list(dict.fromkeys(found))
    for a, b in _EXCLUSIVE:
        if a in kept and b in kept:
            kept.remove(b if kept.index(a) < kept.index(b) else a)
    return frozenset(kept)


@dataclass(frozen=True)
class _Reply:
    """Builds one reply from habits: opening, body, closing, each shaped by what the habits ask."""

    habits: frozenset[str]

    def has(self, habit: str) -> bool:
        return habit in self.habits

    def text(self) -> str:
        if self.has("three-sentences"):
            return self._short()
        lines = self._opening() + self._body() + self._closing()
        return "\n".join(lines)

    def _short(self) -> str:
        # Three sentences at most: the habits that fit in one line each, in the order users read them.
        first = "Working from the numbers you gave," if self.has("intuitive") else ""
        if self.has("polite"):
            first = "Happy to help: " + first
        answer = f"{first} the result comes out to 42".strip()
        answer = answer[0].upper() + answer[1:]
        if self.has("analytic"):
            answer += " since each term adds directly"
        lines = ["## Result"] if self.has("headings") else []
        lines.append(("- " if self.has("bullets") else "1. " if self.has("numbered-steps") else "") + answer + ".")
        if self.has("numbered-steps"):
            lines.append("2. Double-check the total.")
        extra = []
        if self.has("confidence"):
            extra.append("Confidence: 90%.")
        elif self.has("examples"):
            extra.append("For instance, 40 plus 2 gives it.")
        if self.has("proactive"):
            check_in = "; does that make sense so far?" if self.has("incremental") else "."
            extra.append(f"As a next step, you could verify it by hand{check_in}")
        elif self.has("incremental"):
            extra.append("Does that make sense so far?")
        lines += extra[: 2 if not self.has("tldr") else 1]
        if self.has("tldr"):
            lines.append("TL;DR: 42.")
        return "\n".join(lines)

    def _opening(self) -> list[str]:
        out = []
        if self.has("outline-first"):
            out.append("We'll cover the idea, the working, then the result.")
        elif not (self.has("direct") or self.has("blunt")):
            out.append("Great question! I'm happy to help you work through this.")
        if self.has("intuitive"):
            out.append("The big idea: combine the parts, then check the total.")
        if self.has("headings"):
            out += ["", "## Working"]
        return out

    def _body(self) -> list[str]:
        steps = ["Add the given values.", "Check the total against the question."]
        if self.has("analytic"):
            steps = ["Assume the values are exact.", *steps[:1], "Since nothing else enters, the total is the answer."]
        if self.has("incremental"):  # one piece: two numbered sub-points at most, one where numbering is not asked
            steps = steps[: 2 if self.has("numbered-steps") else 1]
        if self.has("numbered-steps"):
            body = [f"{n}. {s}" for n, s in enumerate(steps, 1)]
        elif self.has("bullets"):
            body = [f"- {s}" for s in steps]
        else:
            body = [" ".join(steps)]
        if self.has("examples"):
            body.append("For example, 40 and 2 make 42.")
        if self.has("multiple-approaches"):
            body.append("Alternatively, count on from the larger value; it is slower but easier to check.")
        if self.has("headings"):
            body += ["", "## Result"]
        body.append("So the result is 42.")
        if self.has("confidence"):
            body.append("I'm about 90% confident in it.")
        return body

    def _closing(self) -> list[str]:
        out = []
        if self.has("takeaways"):
            out.append("Key takeaway: add, then check.")
        if self.has("polite") or not (self.has("blunt") or self.has("direct")):
            out.append("Thanks for working through it with me, and I hope this helps!")
        check_in = "does that make sense so far, or should we go on to the next piece?"
        if self.has("proactive"):  # one sentence, so a closing TL;DR leaves both in the reply's last two
            tail = f"; {check_in}" if self.has("incremental") else "."
            out.append(f"As a next step, you could try the same method on a harder case{tail}")
        elif self.has("incremental"):
            out.append(check_in.capitalize())
        elif not (self.has("no-suggestions") or self.has("incremental")):
            out.append("Let me know if you'd like more detail.")
        if self.has("tldr"):
            out.append("TL;DR: the result is 42.")
        return out


def compose_reply(habits: frozenset[str]) -> str:
    """The reader's reply when it follows `habits` (preference ids)."""
    return _Reply(habits).text()


class ScriptedReader:
    """The `NoteAgent` of the next session (memrl.envs.collab.next_session): every reply follows the notes' habits."""

    name = NAME

    async def replies(self, requests: Sequence[tuple[str, list[Message]]]) -> list[str]:
        return [compose_reply(read_habits(notes)) for notes, _ in requests]
