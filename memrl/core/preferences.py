"""The MultiSessionCollab taxonomy of user interaction preferences (paper Appendix A, Table 3), in our own words.

Each preference says what the user wants and when the user pushes back. `original_key` is a short phrase of the
original benchmark's sentence for that preference, so profiles written in the original wording can be mapped here.
It lives in core, below both of its readers: the rewards score notes against it and the collab environment's users
enforce it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from memrl.core.errors import ConfigError, closest


class Category(StrEnum):
    """The six preference dimensions; the opposing pairs share one."""

    DIRECTNESS = "directness"
    POLITENESS = "politeness"
    ANALYTICALITY_INTUITIVENESS = "analyticality_intuitiveness"
    GUIDANCE = "guidance"
    PROACTIVITY = "proactivity"
    HABITUAL_STRATEGIES = "habitual_strategies"


@dataclass(frozen=True)
class Preference:
    """One interaction preference a simulated user holds and enforces."""

    id: str
    category: Category
    strategy: str | None  # habitual sub-group (takeaways, maximizer, planner, worked-examples, general); else None
    description: str  # second person: what the user wants
    enforce_when: str  # when the user objects
    opposite: str | None  # id of the preference that contradicts this one
    checkable: bool  # False: only an LLM judge can tell, no programmatic checker
    original_key: str  # phrase unique to the original benchmark's sentence for this preference


def _p(
    pid: str,
    category: Category,
    description: str,
    enforce_when: str,
    original_key: str,
    *,
    opposite: str | None = None,
    strategy: str | None = None,
    checkable: bool = True,
) -> Preference:
    return Preference(pid, category, strategy, description, enforce_when, opposite, checkable, original_key)


_D, _P, _A, _G, _R, _H = (
    Category.DIRECTNESS,
    Category.POLITENESS,
    Category.ANALYTICALITY_INTUITIVENESS,
    Category.GUIDANCE,
    Category.PROACTIVITY,
    Category.HABITUAL_STRATEGIES,
)

_ALL = [
    _p(
        "direct",
        _D,
        "You want answers that open with the substance and carry no filler.",
        "Object when a reply spends words on warm-up, commentary about itself or segues, such as praising the "
        "question or announcing that it is about to explain.",
        "get directly to the point",
        opposite="narrative",
    ),
    _p(
        "narrative",
        _D,
        "You want replies that read like a flowing conversation: they tie back to what was said before and "
        "connect ideas with transitions.",
        "Object when a reply is clipped or fragmentary (bare lists with no connecting prose), jumps topics "
        "without a bridge, or ignores what you said in your last message.",
        "narrative, conversational, and engaging",
        opposite="direct",
        checkable=False,
    ),
    _p(
        "polite",
        _P,
        "You want the assistant to sound courteous, warm and considerate toward you.",
        "Object when a reply is cold or merely transactional, with no friendly or courteous wording at all.",
        "respectful, considerate, and friendly",
        opposite="blunt",
    ),
    _p(
        "blunt",
        _P,
        "You want plain, unvarnished replies with no niceties, apologies or courtesy phrases.",
        "Object when a reply is padded with niceties, says sorry, or thanks or flatters you.",
        "blunt without pleasantries",
        opposite="polite",
    ),
    _p(
        "analytic",
        _A,
        "When a problem is solved or a concept explained, you want the assumptions spelled out, the reasoning "
        "shown one step at a time, and each conclusion justified.",
        "Object when a reply states a result without deriving it or leaves gaps in the logic.",
        "state relevant assumptions",
        opposite="intuitive",
    ),
    _p(
        "intuitive",
        _A,
        "When a problem is solved or a concept explained, you want the big idea and the general principle first, "
        "and only then the specifics of your case.",
        "Object when a reply opens with formulas, calculations or technical detail before giving the overall picture.",
        "high-level intuition",
        opposite="analytic",
        checkable=False,
    ),
    _p(
        "incremental",
        _G,
        "On problems with several steps, you want one small piece per reply and a check that you are ready "
        "before the next piece.",
        "Object when a reply hands over the whole solution at once instead of going piece by piece.",
        "single small increment",
        opposite="holistic",
    ),
    _p(
        "holistic",
        _G,
        "You want the complete solution in one reply.",
        "Object when a reply needlessly stops after a fragment or keeps asking whether to go on with simple points.",
        "holistic responses",
        opposite="incremental",
    ),
    _p(
        "proactive",
        _R,
        "You want every reply to finish by proposing a follow-up action or next step.",
        "Object whenever an answer ends without suggesting what to do next, however complete it is.",
        "proactive suggestion",
        opposite="no-suggestions",
    ),
    _p(
        "no-suggestions",
        _R,
        "You want the assistant to do exactly what you asked and nothing more.",
        "Object when a reply volunteers recommendations, extra ideas or next steps you did not ask for.",
        "unsolicited suggestions",
        opposite="proactive",
    ),
    _p(
        "takeaways",
        _H,
        "You want a recap of the main lessons to keep for later.",
        "Object when the chat is coming to an end and the assistant has not summarized the key points.",
        "key takeaways",
        strategy="takeaways",
    ),
    _p(
        "multiple-approaches",
        _H,
        "When you get an answer, you want several workable options, each with its pros and cons.",
        "Object when an answer offers a single way to do it without alternatives and their trade-offs.",
        "multiple viable approaches",
        strategy="maximizer",
    ),
    _p(
        "outline-first",
        _H,
        "When you get an answer, you want it to open with a short plan of what it is going to cover.",
        "Object when a reply launches into the content without first laying out that plan.",
        "outline of what will be covered",
        strategy="planner",
    ),
    _p(
        "examples",
        _H,
        "When something is explained to you, you want concrete examples, comparisons or analogies.",
        "Object when an explanation has no example in it.",
        "examples, analogies or metaphors",
        strategy="worked-examples",
    ),
    _p(
        "three-sentences",
        _H,
        "You want every reply to be at most three sentences long.",
        "Object when a reply goes past three sentences.",
        "no longer than three sentences",
        strategy="general",
    ),
    _p(
        "bullets",
        _H,
        "You want replies laid out as bullet lists; some prose around the list is fine.",
        "Object only when a reply has no list item at all (a line starting with '-', '*' or '1.').",
        "bullet-point format",
        strategy="general",
    ),
    _p(
        "numbered-steps",
        _H,
        "You want replies organized as a sequence of steps, each with its number.",
        "Object when the steps of a reply are not numbered one by one.",
        "numbered steps",
        strategy="general",
    ),
    _p(
        "headings",
        _H,
        "You want replies split into sections, each under its own heading.",
        "Object when a reply's sections have no headings.",
        "headings for each section",
        strategy="general",
    ),
    _p(
        "tldr",
        _H,
        "You want each reply to close with a single-line TL;DR.",
        "Object when a reply does not end with a one-line summary.",
        "one-line TL;DR",
        strategy="general",
    ),
    _p(
        "confidence",
        _H,
        "When you get an answer, you want to be told how sure the assistant is of it.",
        "Object when a reply gives an answer with no estimate of its confidence, such as a percentage.",
        "confidence estimates",
        strategy="general",
    ),
]

TAXONOMY: dict[str, Preference] = {p.id: p for p in _ALL}


def _unknown(kind: str, word: str, options: list[str]) -> ConfigError:
    match = closest(word, options)
    hint = f"; did you mean {match!r}?" if match else ""
    return ConfigError(f"unknown {kind} {word!r}{hint} (see `memrl collab preferences`)")


def get_preference(pid: str) -> Preference:
    """The preference with id `pid`; ConfigError (one line, closest id suggested) if there is none."""
    try:
        return TAXONOMY[pid]
    except KeyError:
        raise _unknown("preference", pid, list(TAXONOMY)) from None


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def from_original(text: str) -> Preference:
    """Map one of the original benchmark's preference sentences to our preference, via its `original_key`."""
    norm = _normalize(text)
    hits = [p for p in TAXONOMY.values() if _normalize(p.original_key) in norm]
    if len(hits) == 1:
        return hits[0]
    short = norm[:60] + ("..." if len(norm) > 60 else "")
    why = "no known preference" if not hits else "several preferences: " + ", ".join(p.id for p in hits)
    raise ConfigError(f"original preference {short!r} matches {why} (see `memrl collab preferences`)")


def as_prompt_text(p: Preference) -> str:
    """What a user simulator or an agent oracle is told about the preference."""
    return f"{p.description} {p.enforce_when}"


# One request per preference, in the user's voice; the rule user names exactly what was violated.
REQUESTS: dict[str, str] = {
    "direct": "Skip the preamble and get straight to the point.",
    "narrative": "Could you explain that in a more conversational, connected way?",
    "polite": "Please be a bit friendlier and more courteous with me.",
    "blunt": "No pleasantries or apologies, please; just be blunt.",
    "analytic": "State your assumptions and show each reasoning step before the conclusion.",
    "intuitive": "Start with the big-picture idea before the details.",
    "incremental": "Give me one small step at a time and check with me before moving on.",
    "holistic": "Don't split it up or keep asking whether to continue; give me the whole thing.",
    "proactive": "End your answer with a suggestion for what I could do next.",
    "no-suggestions": "Answer only what I asked, without extra suggestions or next steps.",
    "takeaways": "Before we wrap up, give me the key takeaways.",
    "multiple-approaches": "Show me more than one way to do this, with the trade-offs of each.",
    "outline-first": "Start with a short outline of what you are going to cover.",
    "examples": "Include an example or an analogy, please.",
    "three-sentences": "Keep replies to three sentences at most.",
    "bullets": "Put that in bullet points.",
    "numbered-steps": "Number the steps, please.",
    "headings": "Use a heading for each section.",
    "tldr": "End with a one-line TL;DR.",
    "confidence": "Tell me how confident you are in that answer.",
}
