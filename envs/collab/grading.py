"""Grading a draft answer: symbolic math with math_verify, option matching for choice tasks, an LLM judge otherwise.

Rule-based graders never raise; when they cannot reach a verdict they say so with `Grade.failed`, and `Grader` then
asks the judge if it has one.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache

from memrl.core.errors import ConfigError
from memrl.envs.collab.problems import AnswerKind, Problem
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, parse_json_object


@dataclass(frozen=True)
class Grade:
    correct: bool
    method: str  # "math_verify", "string_match", "choice", "judge" or "abstain"
    reasoning: str = ""
    failed: bool = False  # no verdict was reached (unparseable draft or judge output); `correct` is then False


# ---------------------------------------------------------------- abstentions

_ABSTAIN = {"", "i don't know", "i do not know", "idk", "i'm not sure", "i am not sure", "not sure", "no answer", "n/a"}


def is_abstention(draft: str) -> bool:
    """True for an empty draft or one that only says it does not know."""
    text = re.sub(r"[^\w' /]+", " ", draft.lower().replace("’", "'"))
    return " ".join(text.split()) in _ABSTAIN


# ---------------------------------------------------------------- math

_MARKER = re.compile(r"\banswer\s*(?:is|was|would be|:|=)\s*:?\s*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?=\s|$)|\n")
_MATH_MODE = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_LATEX_HINT = re.compile(r"[\\^_{]")
# Plain-text spellings a user types, rewritten so the LaTeX parser reads them as one symbol, not a product of letters.
_PLAIN_MATH = (
    (re.compile(r"(?<!\\)\bsqrt\s*\(([^()]*)\)"), r"\\sqrt{\1}"),
    (re.compile(r"(?<!\\)\bsqrt\b"), r"\\sqrt"),
    (re.compile(r"(?<!\\)\bpi\b"), r"\\pi"),
    (re.compile(r"(?<!\\)\binf(?:inity)?\b"), r"\\infty"),
)
_TEXT_GOLD = re.compile(r"^\\text\{(.+)\}$|^([A-Za-z][A-Za-z '\-]{2,})$")  # a word answer, not an expression


# Off the main thread math_verify runs without a timeout and warns about it on every call.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _timeout() -> int | None:
    # math_verify times out with SIGALRM, which only the main thread may set.
    return 5 if threading.current_thread() is threading.main_thread() else None


def _parse(text: str) -> list[object]:
    from math_verify import parse

    try:
        return list(parse(text, parsing_timeout=_timeout()))
    except Exception:  # a timeout or a parser bug is "nothing extracted", never a crash
        return []


def _answer_span(draft: str) -> str:
    """The text after the last 'answer is' / 'answer:' up to the end of that sentence, else the whole draft."""
    found = list(_MARKER.finditer(draft))
    if not found:
        return draft
    tail = _SENTENCE_END.split(draft[found[-1].end() :], maxsplit=1)[0].strip()
    return tail or draft


def _readings(span: str) -> list[str]:
    """Ways to hand `span` to math_verify, best first: as it stands if it has math mode, else as LaTeX or as text."""
    if _MATH_MODE.search(span):
        return [span]
    for pattern, latex in _PLAIN_MATH:
        span = pattern.sub(latex, span)
    wrapped = f"${span}$"
    return [wrapped, span] if _LATEX_HINT.search(span) else [span, wrapped]


def _extract(draft: str) -> tuple[str, list[object]]:
    """The first reading of the draft's final answer math_verify can parse, and what it parsed to."""
    text = draft.replace("\\$", "")  # a dollar sign for currency, not math mode
    spans = [text] if "\\boxed" in text or "\\fbox" in text else [_answer_span(text), text]
    for span in dict.fromkeys(spans):
        for reading in _readings(span):
            parsed = _parse(reading)
            if parsed:
                return reading, parsed
    return "", []


_PUNCTUATION = re.compile(r"[\s.,;:!?\"'“”‘’`()\[\]{}*_]+")


def _words(text: str) -> str:
    """Lower-case words with punctuation dropped; symbols such as < > = Δ stay, they tell options apart."""
    return " ".join(_PUNCTUATION.sub(" ", unicodedata.normalize("NFKC", text).lower()).split())


def _grade_text(draft: str, gold_text: str) -> Grade:
    """Gold answers that are words (a name, a day) are matched as words in the draft's final answer."""
    found = f" {_words(gold_text)} " in f" {_words(_answer_span(draft))} "
    return Grade(found, "string_match", f"gold {gold_text!r} {'found' if found else 'not found'} in the answer")


@lru_cache(maxsize=8192)  # sympy parsing costs milliseconds, and users re-read the same answers turn after turn
def grade_math(draft: str, gold: str) -> Grade:
    """Symbolic equivalence of the draft's final answer and `gold` (LaTeX, usually a \\boxed{} content)."""
    from math_verify import verify

    if is_abstention(draft):
        return Grade(False, "abstain", "the draft gives no answer")
    text_gold = _TEXT_GOLD.match(gold.strip())
    if text_gold:
        return _grade_text(draft, text_gold.group(1) or text_gold.group(2))
    gold_parsed = _parse(gold if _MATH_MODE.search(gold) else f"${gold}$") or _parse(gold)
    if not gold_parsed:
        return Grade(False, "math_verify", f"gold answer {gold!r} could not be parsed", failed=True)
    reading, parsed = _extract(draft)
    if not parsed:
        return Grade(False, "math_verify", "no final answer could be parsed from the draft", failed=True)
    try:
        same = bool(verify(gold_parsed, parsed, timeout_seconds=_timeout()))
    except Exception as err:  # verification gave up (timeout, sympy error): say so rather than guess
        return Grade(False, "math_verify", f"verification failed: {type(err).__name__}", failed=True)
    verdict = "equals" if same else "differs from"
    return Grade(same, "math_verify", f"draft answer {reading.strip()!r} {verdict} gold {gold!r}")


# ---------------------------------------------------------------- multiple choice

_LABEL = r"(?P<l>[A-Z]|\d{1,2})"
# Ways a draft names an option by its label. Numbers count only after a keyword or alone: numbered steps
# ("1. First ...") and cited conditions ("(1)") would otherwise read as options.
_LABEL_PATTERNS = (
    re.compile(r"\(\s*(?P<l>[A-Z])\s*\)"),  # (B)
    re.compile(r"(?m)^[\s>#*_-]*(?P<l>[A-Z])\**\s*[.):](?=\s|$)"),  # "B. text" / "**B)**" opening a line
    re.compile(rf"(?i:\b(?:answer|option|choice)s?\b(?:\s+(?:is|was|would be))?)\s*[:=-]?\s*[*(]*{_LABEL}\b(?![.,]\d)"),
    re.compile(rf"^\W*{_LABEL}\W*$"),  # the whole draft is a label
)


def _label_index(token: str, problem: Problem) -> int | None:
    """The option a label names: letters count by position, numbers only where the question numbers its options."""
    n = len(problem.choices)
    if token.isdigit():
        numbered = problem.labels[:1] == ("0",)
        return int(token) if numbered and int(token) < n else None
    index = ord(token) - ord("A")
    return index if index < n else None


def _named_options(draft: str, problem: Problem) -> set[int]:
    option_words = {_words(c) for c in problem.choices}
    named = set()
    for pattern in _LABEL_PATTERNS:
        for match in pattern.finditer(draft):
            token = match.group("l")
            if token.isdigit() and token in option_words:  # "the answer is 4" where an option reads "4"
                continue
            index = _label_index(token, problem)
            if index is not None:
                named.add(index)
    return named


def _quoted_options(draft: str, problem: Problem) -> set[int]:
    """Options whose text appears (as whole words) in the draft, minus those only seen inside a longer quoted one."""
    text = f" {_words(draft)} "
    words = [_words(c) for c in problem.choices]
    found = {i for i, w in enumerate(words) if w and f" {w} " in text}
    return {i for i in found if not any(j != i and f" {words[i]} " in f" {words[j]} " for j in found)}


def grade_choice(draft: str, problem: Problem) -> Grade:
    """Right when the draft names the gold option's label or quotes its text, and names no other option's label."""
    if is_abstention(draft):
        return Grade(False, "abstain", "the draft gives no answer")
    gold = problem.answer_index
    if gold < 0:
        return Grade(False, "choice", "problem's answer is not one of its options", failed=True)
    labels = problem.labels
    named = _named_options(draft, problem)
    if named - {gold}:
        others = ", ".join(labels[i] for i in sorted(named - {gold}))
        return Grade(False, "choice", f"names option {others}; the answer is {labels[gold]}")
    if gold in named:
        return Grade(True, "choice", f"names option {labels[gold]}")
    quoted = _quoted_options(draft, problem)
    if quoted == {gold}:
        return Grade(True, "choice", f"quotes the text of option {labels[gold]}")
    if quoted and gold not in quoted:
        others = ", ".join(labels[i] for i in sorted(quoted))
        return Grade(False, "choice", f"quotes option {others}; the answer is {labels[gold]}")
    why = "quotes several options" if quoted else "names no option"
    return Grade(False, "choice", f"draft {why}: no verdict", failed=True)


# ---------------------------------------------------------------- LLM judge

JUDGE_PROMPT = """You are checking whether a proposed answer to a problem is right.

Problem:
{question}

Reference answer (known to be right):
{answer}

Proposed answer:
{draft}

Decide whether the proposed answer reaches the same final result as the reference. Different wording, equivalent \
forms and harmless extra explanation are fine; hedging between several results or leaving the result out is not.
Reply with only a JSON object of the form {{"reasoning": "<one or two sentences>", "correct": 1}} \
(1 when it is right, 0 when it is not)."""

_VERDICTS = {"1": True, "true": True, "yes": True, "correct": True, "0": False, "false": False, "no": False}


def _verdict(value: object) -> bool | None:
    key = str(value).strip().lower()
    key = {"1.0": "1", "0.0": "0", "incorrect": "0", "wrong": "0"}.get(key, key)
    return _VERDICTS.get(key)


def read_judge_output(text: str) -> Grade:
    """The judge's verdict from its reply; a reply without a readable 0/1 `correct` gives a failed Grade."""
    parsed = parse_json_object(text, required=("correct",))
    if isinstance(parsed, JSONParseFailure):
        return Grade(False, "judge", f"judge output unparseable: {parsed.reason}", failed=True)
    verdict = _verdict(parsed.data["correct"])
    if verdict is None:
        return Grade(False, "judge", f"judge output unparseable: 'correct' is {parsed.data['correct']!r}", failed=True)
    return Grade(verdict, "judge", str(parsed.data.get("reasoning", "")))


async def judge_answer(backend: ChatBackend, problem: Problem, draft: str, sampling: SamplingParams) -> Grade:
    """Ask `backend` whether `draft` reaches the gold answer of `problem`."""
    prompt = JUDGE_PROMPT.format(question=problem.question, answer=problem.answer, draft=draft)
    messages: list[Message] = [{"role": "user", "content": prompt}]
    completion = await backend.achat(messages, sampling)
    return read_judge_output(completion.text)


class Grader:
    """Grades drafts by problem kind; rule-based graders defer to the judge (when given) if they reach no verdict."""

    def __init__(self, judge: ChatBackend | None = None, sampling: SamplingParams | None = None) -> None:
        self.judge = judge
        self.sampling = sampling or SamplingParams(temperature=0.0, max_tokens=512)
        self._graders: dict[AnswerKind, Callable[[Problem, str], Awaitable[Grade]]] = {
            AnswerKind.MATH: self._by_rule(lambda p, d: grade_math(d, p.answer)),
            AnswerKind.CHOICE: self._by_rule(lambda p, d: grade_choice(d, p)),
            AnswerKind.FREE: self._by_judge,
        }

    async def grade(self, problem: Problem, draft: str) -> Grade:
        if problem.kind is AnswerKind.FREE and self.judge is None:
            raise ConfigError(f"problem {problem.id} needs an LLM judge to grade free-form answers, but none is set")
        if is_abstention(draft):
            return Grade(False, "abstain", "the draft gives no answer")
        return await self._graders[problem.kind](problem, draft)

    def _by_rule(self, rule: Callable[[Problem, str], Grade]) -> Callable[[Problem, str], Awaitable[Grade]]:
        async def grade(problem: Problem, draft: str) -> Grade:
            result = rule(problem, draft)
            return await self._by_judge(problem, draft) if result.failed and self.judge is not None else result

        return grade

    async def _by_judge(self, problem: Problem, draft: str) -> Grade:
        assert self.judge is not None  # `grade` checked
        return await judge_answer(self.judge, problem, draft, self.sampling)
