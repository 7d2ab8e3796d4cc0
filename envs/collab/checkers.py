"""Programmatic checks of agent responses against the checkable interaction preferences.

Each checker is a few regexes over the response plus a little structure (lines, paragraphs, sentences). They are
heuristics: a verdict of UNDECIDABLE means the text alone cannot tell, or the preference does not apply this turn.
Preferences whose `checkable` is False (narrative, intuitive) are left to an LLM judge.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from memrl.core.preferences import get_preference


class Verdict(StrEnum):
    SATISFIED = "satisfied"
    VIOLATED = "violated"
    UNDECIDABLE = "undecidable"


@dataclass(frozen=True)
class CheckResult:
    preference: str
    verdict: Verdict
    reason: str  # one short sentence saying why


@dataclass(frozen=True)
class TurnContext:
    """What the checkers need to know about the turn beyond the response text."""

    winding_down: bool = False  # the conversation is ending: the only time `takeaways` applies
    clarifying: bool = False  # the response asks about the problem instead of answering: answer formats don't apply


Checker = Callable[[str, TurnContext], CheckResult]
_Outcome = tuple[Verdict, str]
_NO_CONTEXT = TurnContext()
_OK, _BAD, _UNSURE = Verdict.SATISFIED, Verdict.VIOLATED, Verdict.UNDECIDABLE


def _rx(*phrases: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in phrases), re.IGNORECASE | re.MULTILINE)


# --- phrase tables -------------------------------------------------------------------------------------------------

PREAMBLE = _rx(  # openers that delay the substance (directness)
    r"\b(?:great|good|excellent|interesting|fantastic|nice) question\b",
    r"\bthat's a (?:great|good|fair|interesting)\b",
    r"^(?:sure|certainly|of course|absolutely|okay|ok|alright|great|so|well)\b\s*[!,.]",
    r"\blet(?: me|'s) (?:walk|go|break|dive|explain|take a look|look|unpack|think)\b",
    r"\bI(?:'d| would|'m|'ll| will)? (?:be )?(?:happy|glad|delighted) to\b",
    r"^(?:here's|here is|below is|below are)\b",
    r"\bthanks? (?:you )?for (?:asking|the question|your question)\b",
    r"\bto answer your question\b",
    r"\bin this (?:response|answer)\b",
    r"\bI(?:'ll| will) (?:walk|explain|go through)\b",
    r"\bnow that (?:we|you)\b",
)
COURTESY = _rx(  # pleasantries, apologies and courtesy markers (a blunt user objects to any)
    r"\bsorry\b",
    r"\bapologi[sz]e",
    r"\bmy apologies\b",
    r"\bthank(?:s| you)\b",
    r"\bplease\b",
    r"\bkindly\b",
    r"\b(?:happy|glad|delighted|pleased) to (?:help|assist|explain|hear)\b",
    r"\bhope (?:this|that|it) helps\b",
    r"\b(?:great|good|excellent|wonderful|fantastic) question\b",
    r"\bmy pleasure\b",
    r"\byou're welcome\b",
    r"\bfeel free\b",
    r"\bdon't hesitate\b",
    r"\bgood luck\b",
    r"\bhave a (?:great|nice|good) (?:day|one)\b",
)
FRIENDLY = _rx(  # warmth short of formal courtesy: enough for a user who wants politeness
    r"\blet's\b",
    r"\b(?:happy|glad)\b",
    r"\bhope\b",
    r"\b(?:great|nice|well done|good job|good catch)\b",
    r"\b(?:certainly|of course|absolutely)\b",
    r"\byou've got (?:this|it)\b",
    r"\benjoy\b",
)
SUGGESTION = _rx(  # a proposed follow-up or next step (proactive wants one at the end, no-suggestions none)
    r"\bnext,? you (?:could|can|might|may|should)\b",
    r"\b(?:as a|a good|one|your) next step\b",
    r"\bhere are (?:some|a few) (?:next steps|suggestions|ideas)\b",
    r"\byou (?:might|may|could|can) also\b",
    r"\byou (?:might|may) (?:want|wish|like) to\b",
    r"\bwould you like (?:me )?to\b",
    r"\bwant me to\b",
    r"\bI(?:'d| would) (?:also )?(?:recommend|suggest)\b",
    r"\bconsider \w+ing\b",
    r"\bif you(?:'d| would)? like,? (?:I|we) can\b",
    r"\blet me know if you(?:'d| would)? (?:like|want)\b",
    r"\bI can also\b",
    r"\bfrom here,? you\b",
    r"\bto (?:go|take (?:this|it)) further\b",
    r"\bfollow[- ]up\b",
)
CONTINUE = _rx(  # stopping after a fragment to ask whether to go on (a holistic user objects)
    r"\b(?:should|shall|can|may) (?:I|we) (?:continue|go on|proceed|keep going|move on)\b",
    r"\b(?:want|like) me to (?:continue|go on|proceed|keep going|move on)\b",
    r"\bbefore (?:we|I) (?:continue|go on|proceed|move on)\b",
    r"\bready (?:for|to (?:move on|continue|go on))\b",
    r"\blet me know when you(?:'re| are) ready\b",
    r"\b(?:part|step) (?:1|one) first\b",
    r"\bthen we(?:'ll| will| can) (?:move on|continue)\b",
)
CHECK_IN = _rx(  # asking the user to confirm understanding (with CONTINUE: what an incremental user wants)
    r"\bdoes (?:this|that|it) make sense\b",
    r"\b(?:is|was) (?:this|that|it) clear\b",
    r"\bany questions\b",
    r"\b(?:ok|okay|clear|good) so far\b",
    r"\b(?:with me|following) so far\b",
    r"\bcan you try\b",
)
APPROACH_LABEL = re.compile(r"\b(?i:approach|option|method|solution|alternative)\s*#?\s*(\d+|[A-D])\b")
ALTERNATIVE = _rx(
    r"\balternatively\b",
    r"\banother (?:way|approach|option|method)\b",
    r"\ban alternative\b",
    r"\bon the other hand\b",
    r"\b(?:first|second|third) (?:approach|option|method|way)\b",
    r"\bor you could\b",
    r"\byou could (?:also )?(?:use|do|try)\b[^.\n]*\bor\b",
)
TRADEOFF = _rx(
    r"\btrade-?offs?\b",
    r"\bpros\b",
    r"\bcons\b",
    r"\b(?:faster|slower|easier|harder|simpler|cheaper|safer|shorter|longer)\b",
    r"\b(?:more|less) (?:efficient|readable|memory|robust|flexible|accurate|complex|verbose|performant)\b",
    r"\b(?:but|however|whereas|at the cost of|downside|drawback|advantage)\b",
)
OUTLINE = _rx(  # an opening that announces the plan (planner)
    r"\bhere(?:'s| is) what (?:we'll|we will|I'll|I will|this) (?:cover|go over|do|look at)\b",
    r"^(?:plan|outline|overview|roadmap|agenda)\b",
    r"\bwe(?:'ll| will) (?:cover|go through|go over|walk through|look at)\b",
    r"\bI(?:'ll| will) (?:cover|go through|go over)\b",
    r"\bhere(?:'s| is) (?:the|our|my) (?:plan|outline|roadmap)\b",
    r"\bfirst\b.*\bthen\b.*\b(?:finally|lastly)\b",
)
EXAMPLE = _rx(
    r"\bfor (?:example|instance)\b",
    r"\be\.g\.",
    r"\bexample\s*:",
    r"\bas an example\b",
    r"\bimagine\b",
    r"\bsuppose\b",
    r"\bsay you\b",
    r"\b(?:just )?like a\b",
    r"\bthink of (?:it|this|them) as\b",
    r"\banalog(?:y|ous)\b",
    r"\bmetaphor\b",
    r"\bsuch as\b",
)
TAKEAWAY = _rx(
    r"\btakeaways?\b",
    r"\bto (?:sum up|summari[sz]e|recap)\b",
    r"\bin summary\b",
    r"\bsummary\b",
    r"\brecap\b",
    r"\bkey (?:points|ideas|lessons)\b",
    r"\bin short\b",
    r"\btl;?dr\b",
)
REASONING = _rx(  # justification words (analytic)
    r"\bassum(?:e|es|ed|ing|ption)\b",
    r"\bbecause\b",
    r"\bsince\b",
    r"\b(?:therefore|thus|hence|consequently|so)\b",
    r"\b(?:which|this) (?:means|gives)\b",
    r"\bit follows\b",
    r"\bgiven (?:that|the)\b",
    r"\bimplies\b",
    r"\bstep \d\b",
    r"\bwe (?:get|have|know|derive|can derive)\b",
)
CONFIDENCE = _rx(
    r"\b\d{1,3}(?:\.\d+)?\s*%\s*(?:confident|sure|certain|confidence|likely)\b",
    r"\b(?:confiden(?:t|ce)|sure|certain(?:ty)?)\b[^.\n]{0,30}?\b\d{1,3}(?:\.\d+)?\s*%",
    r"\bconfidence(?: level)?\s*(?:[:=(-]|is)\s*\(?\s*(?:very )?(?:high|medium|moderate|low|\d)",
    r"\b(?:high|medium|moderate|low) confidence\b",
)
TLDR = re.compile(r"^[\s*_>#-]*(?:tl;?\s?dr|in short|summary\s*:|bottom line)[\s*_:,.-]*", re.IGNORECASE)
ANSWER_CONTENT = _rx(r"\bthe answer is\b", r"\b(?:answer|solution|result)\s*:", r"=", r"\\boxed")

# --- structure -----------------------------------------------------------------------------------------------------

_CODE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_CLOSERS = "\"'”’)]*_"
_LIST_MARKER = re.compile(r"^(?:[-*•+]|(?:\*\*)?\d+[.)](?:\*\*)?)\s+(?=\S)")
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*•+]|\d+[.)])[ \t]+\S", re.MULTILINE)
_NUMBERED = re.compile(r"^[ \t]*(?:\*\*)?(\d+)[.)]", re.MULTILINE)
_STEP = re.compile(r"\bstep\s+(\d+)\b", re.IGNORECASE)
_MD_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+\S.*$", re.MULTILINE)
_HEADING = re.compile(r"^[ \t]{0,3}(?:#{1,6}[ \t]+\S.*|\*\*[^*\n]+\*\*:?|__[^_\n]+__:?)[ \t]*$", re.MULTILINE)
_INITIALISM = re.compile(r"\b(?:[A-Za-z]\.){2,}")  # e.g. i.e. a.m. U.S.
_ABBREVIATION = re.compile(r"\b(?:vs|cf|approx|Dr|Mr|Mrs|Ms|Prof|Fig|etc(?=\.\s*[a-z,;)]))\.")
_SENTENCE = re.compile(rf"\S.*?(?:[.!?]+[{re.escape(_CLOSERS)}]*(?=\s|$)|$)", re.DOTALL)


def _prose(text: str) -> str:
    """The response without code blocks, with typographic apostrophes made plain so the tables match."""
    return _CODE.sub("\n", text).replace("’", "'")


def _units(text: str) -> list[str]:
    """Prose paragraphs and list items, one string each; markdown headings are titles, not sentences."""
    units: list[str] = []
    prose: list[str] = []
    for raw in _prose(text).splitlines():
        line = raw.strip()
        item = _LIST_MARKER.match(line)
        if not line or item or _MD_HEADING.match(line):
            if prose:
                units.append(" ".join(prose))
                prose = []
            if item:
                units.append(line[item.end() :])
            continue
        prose.append(line)  # consecutive lines of prose are one paragraph (hard-wrapped text)
    if prose:
        units.append(" ".join(prose))
    return units


def _unit_sentences(unit: str) -> list[str]:
    # Drop the dots of abbreviations so they do not end sentences; decimals need nothing: no space follows the dot.
    unit = _ABBREVIATION.sub(lambda m: m.group(0)[:-1], _INITIALISM.sub(lambda m: m.group(0).replace(".", ""), unit))
    return [s.strip() for s in _SENTENCE.findall(unit) if re.search(r"\w", s)]


@lru_cache(maxsize=1024)  # every checker, and the user simulator and the session log, split the same reply
def sentences(text: str) -> tuple[str, ...]:
    """The sentences of a response; a list item or line without a final period counts as one."""
    return tuple(s for unit in _units(text) for s in _unit_sentences(unit))


def _is_question(sentence: str) -> bool:
    return sentence.rstrip(_CLOSERS).endswith("?")


def _numbered_steps(text: str) -> int:
    body = _prose(text)
    return len({m.group(1) for m in _NUMBERED.finditer(body)} | {m.group(1) for m in _STEP.finditer(body)})


def _tail(text: str, n: int = 2) -> str:
    return " ".join(sentences(text)[-n:])


def is_clarifying_question(response: str) -> bool:
    """Heuristic: a short question about the problem with no answer content in it (no list, code or result).

    Offers and check-ins ("Want me to continue?", "Does this make sense?") are not clarifying questions.
    """
    text = response.strip()
    sents = sentences(text)
    if not sents or not _is_question(sents[-1]) or len(text.split()) > 60:
        return False
    if "```" in text or _LIST_ITEM.search(text) or ANSWER_CONTENT.search(text):
        return False
    return not any(rx.search(text) for rx in (CONTINUE, CHECK_IN, SUGGESTION))


# --- checkers ------------------------------------------------------------------------------------------------------

CHECKERS: dict[str, Checker] = {}


def _checker(pid: str, *, answer_only: bool = False) -> Callable[[Callable[[str, TurnContext], _Outcome]], Checker]:
    """Register a checker for `pid`; `answer_only`: the user does not enforce it while the agent clarifies."""

    def register(fn: Callable[[str, TurnContext], _Outcome]) -> Checker:
        def run(response: str, context: TurnContext = _NO_CONTEXT) -> CheckResult:
            if answer_only and context.clarifying:
                return CheckResult(pid, _UNSURE, "a clarifying question is not an answer")
            verdict, reason = fn(response, context)
            return CheckResult(pid, verdict, reason)

        run.__doc__ = fn.__doc__
        CHECKERS[pid] = run
        return run

    return register


def _found(m: re.Match[str]) -> str:
    return repr(m.group(0).strip().lower())


@_checker("direct")
def _direct(response: str, context: TurnContext) -> _Outcome:
    """No preamble, meta-commentary or transition in the opening sentence."""
    first = next(iter(sentences(response)), "").lstrip("*_> ").replace("’", "'")
    if m := PREAMBLE.search(first):
        return _BAD, f"opens with {_found(m)}"
    return _OK, "gets straight to the point"


@_checker("polite")
def _polite(response: str, context: TurnContext) -> _Outcome:
    """At least one courtesy or friendly marker."""
    if m := COURTESY.search(_prose(response)) or FRIENDLY.search(_prose(response)):
        return _OK, f"friendly wording {_found(m)}"
    return _BAD, "no courtesy or friendly wording at all"


@_checker("blunt")
def _blunt(response: str, context: TurnContext) -> _Outcome:
    """No pleasantry, apology or courtesy marker anywhere."""
    if m := COURTESY.search(_prose(response)):
        return _BAD, f"contains the courtesy marker {_found(m)}"
    return _OK, "no pleasantries"


@_checker("analytic", answer_only=True)
def _analytic(response: str, context: TurnContext) -> _Outcome:
    """Assumptions or reasoning words justify the result."""
    if m := REASONING.search(_prose(response)):
        return _OK, f"justifies the answer ({_found(m)})"
    return _BAD, "states a result without reasoning"


@_checker("incremental", answer_only=True)
def _incremental(response: str, context: TurnContext) -> _Outcome:
    """One increment (a couple of numbered sub-points at most), ending with a check-in before going on."""
    if (steps := _numbered_steps(response)) > 2:
        return _BAD, f"covers {steps} numbered steps in one reply"
    tail = _tail(response)
    if m := CONTINUE.search(tail) or CHECK_IN.search(tail):
        return _OK, f"one increment, then asks {_found(m)}"
    return _BAD, "does not check in before moving on"


@_checker("holistic", answer_only=True)
def _holistic(response: str, context: TurnContext) -> _Outcome:
    """Does not stop after a fragment to ask whether to go on."""
    if m := CONTINUE.search(_prose(response)):
        return _BAD, f"stops to ask {_found(m)}"
    return _OK, "gives the whole answer without pausing"


@_checker("proactive", answer_only=True)
def _proactive(response: str, context: TurnContext) -> _Outcome:
    """The last sentences propose a next step or follow-up."""
    if m := SUGGESTION.search(_tail(response)):
        return _OK, f"ends with a suggestion ({_found(m)})"
    return _BAD, "ends without suggesting a next step"


@_checker("no-suggestions")
def _no_suggestions(response: str, context: TurnContext) -> _Outcome:
    """No unsolicited suggestion or next step anywhere."""
    if m := SUGGESTION.search(_prose(response)):
        return _BAD, f"volunteers a suggestion ({_found(m)})"
    return _OK, "sticks to the request"


@_checker("takeaways")
def _takeaways(response: str, context: TurnContext) -> _Outcome:
    """A recap of key points, required only as the conversation winds down."""
    if not context.winding_down:
        return _UNSURE, "only enforced when the conversation is winding down"
    if m := TAKEAWAY.search(_prose(response)):
        return _OK, f"recaps the key points ({_found(m)})"
    return _BAD, "the conversation ends without a summary of key points"


@_checker("multiple-approaches", answer_only=True)
def _multiple_approaches(response: str, context: TurnContext) -> _Outcome:
    """Two or more approaches, with trade-offs."""
    body = _prose(response)
    labels = {m.group(1).lower() for m in APPROACH_LABEL.finditer(body)}
    if len(labels) < 2 and not ALTERNATIVE.search(body):
        return _BAD, "offers a single approach"
    if not TRADEOFF.search(body):
        return _BAD, "names alternatives but no trade-offs"
    return _OK, "offers alternatives with trade-offs"


@_checker("outline-first", answer_only=True)
def _outline_first(response: str, context: TurnContext) -> _Outcome:
    """The opening line announces a plan, and content follows it."""
    lines = [line.strip() for line in _prose(response).splitlines() if line.strip()]
    if not lines:
        return _BAD, "empty response"
    opening = " ".join(_unit_sentences(lines[0].lstrip("#*_> "))[:2])
    if not OUTLINE.search(opening):
        return _BAD, "starts without an outline"
    if len(lines) == 1 and len(_unit_sentences(lines[0])) <= 2:
        return _BAD, "announces a plan but no content follows"
    return _OK, "opens with an outline"


@_checker("examples", answer_only=True)
def _examples(response: str, context: TurnContext) -> _Outcome:
    """An example, analogy or metaphor."""
    if m := EXAMPLE.search(_prose(response)):
        return _OK, f"gives an example ({_found(m)})"
    return _BAD, "no example or analogy"


@_checker("three-sentences")
def _three_sentences(response: str, context: TurnContext) -> _Outcome:
    """At most three sentences; applies to every reply, clarifying questions included."""
    n = len(sentences(response))
    if n > 3:
        return _BAD, f"{n} sentences, more than 3"
    return _OK, f"{n} sentence{'s' if n != 1 else ''}, at most 3"


@_checker("bullets", answer_only=True)
def _bullets(response: str, context: TurnContext) -> _Outcome:
    """At least one list item; prose around it is fine."""
    if n := len(_LIST_ITEM.findall(_prose(response))):
        return _OK, f"{n} list item{'s' if n != 1 else ''}"
    return _BAD, "no list item"


@_checker("numbered-steps", answer_only=True)
def _numbered_steps_checker(response: str, context: TurnContext) -> _Outcome:
    """At least two numbered steps (1. 2., 1) 2), or Step 1, Step 2)."""
    if (n := _numbered_steps(response)) >= 2:
        return _OK, f"{n} numbered steps"
    return _BAD, f"{n} numbered step{'s' if n != 1 else ''}, fewer than 2"


@_checker("headings", answer_only=True)
def _headings(response: str, context: TurnContext) -> _Outcome:
    """Markdown or bold-line headings: one is enough for a single paragraph, otherwise at least two."""
    body = _prose(response)
    heads = len(_HEADING.findall(body))
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", _HEADING.sub("", body)) if p.strip()]
    need = 2 if len(paragraphs) > 1 else 1
    if heads >= need:
        return _OK, f"{heads} heading{'s' if heads != 1 else ''} for {len(paragraphs)} paragraph(s)"
    return _BAD, f"{heads} heading{'s' if heads != 1 else ''} for {len(paragraphs)} paragraph(s), {need} needed"


@_checker("tldr", answer_only=True)
def _tldr(response: str, context: TurnContext) -> _Outcome:
    """The last non-empty line is a TL;DR (TL;DR/TLDR, "In short", "Summary:") with its summary on that line."""
    lines = [line for line in _prose(response).splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if (m := TLDR.match(last)) and last[m.end() :].strip(" *_"):
        return _OK, "ends with a one-line TL;DR"
    if any(TLDR.match(line) for line in lines):
        return _BAD, "the TL;DR is not a single last line"
    return _BAD, "no TL;DR at the end"


@_checker("confidence", answer_only=True)
def _confidence(response: str, context: TurnContext) -> _Outcome:
    """A confidence estimate, when the response gives an answer at all."""
    sents = sentences(response)
    if not sents or all(_is_question(s) for s in sents):
        return _UNSURE, "the response gives no answer to be confident about"
    if m := CONFIDENCE.search(_prose(response)):
        return _OK, f"states its confidence ({_found(m)})"
    return _BAD, "answers without a confidence estimate"


def check(pid: str, response: str, context: TurnContext = _NO_CONTEXT) -> CheckResult:
    """Check `response` against preference `pid`; judge-only preferences are UNDECIDABLE."""
    pref = get_preference(pid)
    if not pref.checkable:
        return CheckResult(pid, _UNSURE, "judge-only: text patterns cannot decide this preference")
    return CHECKERS[pid](response, context)
