"""A scripted agent that follows its notes and nothing else: the reference agent of the next-session outcome reward.

It reads which preferences its notes state (the word cues of `memrl.rewards.taxonomy_match`, one note line at a
time) and writes every reply to satisfy exactly those; what the notes do not name it does its default way, a chatty
four-sentence answer that many preferences object to. No model, no randomness: with it the outcome reward measures
the notes alone, so faithful notes must beat empty or wrong ones.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from memrl.rewards.taxonomy_match import cue_hits
from memrl.rollout.base import Message

ANSWER = "42"  # the agent never sees the problem's answer; the rule user keeps it as a (wrong) draft


def stated_preferences(notes: str) -> frozenset[str]:
    """The preference ids the notes state, line by line (a line is one note)."""
    return frozenset(pid for line in notes.splitlines() if line.strip() for pid in cue_hits(line))


def compose_reply(prefs: Collection[str]) -> str:
    """One reply meeting every preference of `prefs` the checkers can decide (at most one per category, as a user
    holds them); where `prefs` says nothing it keeps the default: a praising opener and a courteous close."""
    p = set(prefs)
    short = "three-sentences" in p
    lines: list[str] = []
    if "headings" in p:
        lines.append("## Answer")
    if "outline-first" in p:
        lines.append("We'll cover the method, then the result.")
    elif not p & {"direct", "blunt"} and not short:
        lines.append("Great question! Let me walk you through it.")
    if "numbered-steps" in p:
        lines += ["1. Add the numbers.", "2. Check the sum."]
    elif "bullets" in p:
        lines += ["- Add the numbers.", "- Check the sum."]
    lines.append(
        f"Because each step adds up, the answer is {ANSWER}." if "analytic" in p else f"The answer is {ANSWER}."
    )
    if "examples" in p:
        lines.append("For example, 2 + 3 makes 5.")
    if "multiple-approaches" in p:
        lines.append("Alternatively, count up one at a time, but that is slower.")
    if "confidence" in p:
        lines.append("I am 90% confident.")
    if "takeaways" in p:
        lines.append("Key takeaway: add carefully.")
    if "polite" in p or not (short or "blunt" in p):
        lines.append("Hope this helps." if short else "Thanks for asking, hope this helps!")
    ending = {
        (True, True): "As a next step, you could check it by hand; does this make sense so far?",
        (True, False): "As a next step, you could check it by hand.",
        (False, True): "Does this make sense so far?",
    }.get(("proactive" in p, "incremental" in p))
    if ending:
        lines.append(ending)
    if "tldr" in p:
        lines.append(f"TL;DR: {ANSWER}.")
    return "\n".join(lines)


class NoteFollowingAgent:
    """The `NoteAgent` of `next_session`: every reply is `compose_reply` of what its notes state."""

    name = "scripted-note-following"

    async def replies(self, requests: Sequence[tuple[str, list[Message]]]) -> list[str]:
        return [compose_reply(stated_preferences(notes)) for notes, _ in requests]
