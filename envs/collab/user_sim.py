"""User simulators: an LLM that plays the user (the paper's contract) and a rule user for offline runs and tests.

A simulator starts one `UserSession` per (user, problem); the session keeps the draft answer and decides, after
each agent reply, whether to enforce a preference, update the draft, or end.
"""

from __future__ import annotations

import hashlib
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from memrl.core.preferences import REQUESTS, as_prompt_text, get_preference
from memrl.envs.collab.checkers import TurnContext, Verdict, check, is_clarifying_question
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import AnswerKind, Problem, get_task
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.prompts import TERMINATE, user_messages
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, field_text, parse_json_object

INITIAL_DRAFT = "I don't know"


@dataclass(frozen=True)
class UserTurn:
    response: str
    enforce: bool = False
    draft_answer: str = INITIAL_DRAFT
    terminate: bool = False
    violated: tuple[str, ...] = ()  # preference ids the checkers found violated in the agent's last reply
    reasoning: str = ""
    parse_failed: bool = False
    truncated: bool = False  # the simulator's reply hit its token budget (its JSON may be cut)


def checker_verdicts(profile: UserProfile, reply: str, context: TurnContext) -> dict[str, Verdict]:
    return {pid: check(pid, reply, context).verdict for pid in profile.preferences}


class UserSession(ABC):
    def __init__(self, profile: UserProfile, problem: Problem, max_turns: int) -> None:
        self.profile = profile
        self.problem = problem
        self.max_turns = max_turns
        self.draft = INITIAL_DRAFT

    @abstractmethod
    async def open(self, greeting: str | None = None) -> UserTurn:
        """The user's first message: a description of the problem (an answer to the agent's `greeting`, if any)."""

    @abstractmethod
    async def reply(self, turns: Sequence[Message]) -> UserTurn:
        """React to the agent's last message (`turns[-1]`)."""


class UserSimulator(ABC):
    @abstractmethod
    def start(self, profile: UserProfile, problem: Problem, max_turns: int) -> UserSession: ...

    def seeded(self, seed: int) -> UserSimulator:
        """This simulator drawing what it draws (phrasing, sampling) from `seed`; one that draws nothing is itself."""
        return self


# --- rule simulator -----------------------------------------------------------------------------------------------


_ENFORCE_OPENERS = ("Hold on.", "Before we go on:", "That doesn't work for me.", "Wait.")
_OPENERS = ("Can you help me with this?", "I'm stuck on a problem.", "I need a hand with something.")
_CLARIFY = ("Here is everything I have:", "This is the whole problem as I have it:")
_NOT_YET = ("I'm not sure I have the answer yet. Can you keep going?", "That doesn't settle it for me. What next?")
_THANKS = "Thanks, that answers it."
_STUCK = "I don't think we're getting anywhere; let's stop here."

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:|=)\s*\$?([^\n$]+?)\$?\s*(?:[.!]\s|[.!]?$)", re.I | re.M)
_LETTER = re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-Ea-e])\)?(?![A-Za-z])", re.I)
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?(?:/\d+)?")


def extract_answer(text: str, kind: AnswerKind) -> str | None:
    """The final answer a reply proposes, or None when it proposes none."""
    boxed = _BOXED.findall(text)
    if boxed:
        return f"${boxed[-1]}$"
    if kind is AnswerKind.CHOICE:
        letter = _LETTER.findall(text)
        return f"({letter[-1].upper()})" if letter else None
    stated = _ANSWER_IS.findall(text)
    if stated:
        return stated[-1].strip()
    if kind is AnswerKind.MATH:
        numbers = _NUMBER.findall(text)
        return numbers[-1].replace(",", "") if numbers else None
    return None


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@dataclass
class RuleUserSession(UserSession):
    """Checkers decide enforcement; the draft takes the answer of a compliant reply; ends when it is right.

    The user also ends after `patience` compliant replies that bring no new answer (the agent cannot help).
    """

    profile: UserProfile
    problem: Problem
    max_turns: int
    grader: Grader
    seed: int
    patience: int = 3
    draft: str = INITIAL_DRAFT
    _stale: int = 0
    _turn: int = 0
    _rand: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rand = _rng(self.seed, self.profile.id, self.problem.id)

    async def open(self, greeting: str | None = None) -> UserTurn:
        self._turn = 1
        return UserTurn(f"{self._rand.choice(_OPENERS)} {self.problem.question}")

    async def reply(self, turns: Sequence[Message]) -> UserTurn:
        self._turn += 1
        last = turns[-1]["content"]
        candidate = extract_answer(last, self.problem.kind)
        correct = candidate is not None and (await self.grader.grade(self.problem, candidate)).correct
        context = TurnContext(
            winding_down=correct or self._turn >= self.max_turns, clarifying=is_clarifying_question(last)
        )
        verdicts = checker_verdicts(self.profile, last, context)
        violated = tuple(pid for pid, v in verdicts.items() if v is Verdict.VIOLATED)
        if violated:
            ask = " ".join(REQUESTS[pid] for pid in violated)
            return UserTurn(f"{self._rand.choice(_ENFORCE_OPENERS)} {ask}", True, self.draft, violated=violated)
        if context.clarifying:
            return UserTurn(f"{self._rand.choice(_CLARIFY)} {self.problem.question}", draft_answer=self.draft)
        if candidate is not None and candidate != self.draft:
            self.draft, self._stale = candidate, 0
        else:
            self._stale += 1
        if correct:
            return UserTurn(_THANKS, draft_answer=self.draft, terminate=True)
        if self._stale >= self.patience:
            return UserTurn(_STUCK, draft_answer=self.draft, terminate=True)
        return UserTurn(self._rand.choice(_NOT_YET), draft_answer=self.draft)


@dataclass(frozen=True)
class RuleUserSimulator(UserSimulator):
    grader: Grader
    seed: int = 0
    patience: int = 3

    def start(self, profile: UserProfile, problem: Problem, max_turns: int) -> UserSession:
        return RuleUserSession(profile, problem, max_turns, self.grader, self.seed, self.patience)

    def seeded(self, seed: int) -> RuleUserSimulator:
        return replace(self, seed=seed)


# --- LLM simulator ------------------------------------------------------------------------------------------------


class LLMUserSession(UserSession):
    """An LLM plays the user. The contract is enforced in code too: no draft change or ending while enforcing.

    `original=True` takes the model at its word as the original harness does: the draft it writes is kept even
    while it enforces, and only the stop token in its message ends the session (`should_terminate` is not read)."""

    def __init__(
        self,
        profile: UserProfile,
        problem: Problem,
        max_turns: int,
        backend: ChatBackend,
        sampling: SamplingParams,
        original: bool = False,
    ) -> None:
        super().__init__(profile, problem, max_turns)
        self.backend = backend
        self.sampling = sampling
        self.original = original
        # The original sentence (with its examples) where the profile carries it, else our paraphrase.
        self._preferences = list(profile.wording or (as_prompt_text(get_preference(p)) for p in profile.preferences))
        self._task = get_task(problem.task).description

    async def _ask(self, turns: Sequence[Message]) -> UserTurn:
        messages = user_messages(self._task, self.problem.question, self.profile.persona, self._preferences, turns)
        completion = await self.backend.achat(messages, self.sampling)
        return replace(self._parse(completion.text), truncated=completion.finish_reason == "length")

    def _parse(self, raw: str) -> UserTurn:
        parsed = parse_json_object(raw, required=("response",))
        if isinstance(parsed, JSONParseFailure):
            # Counted as a parse failure; the session goes on with the raw text as the user's message.
            return UserTurn(raw.strip() or "Can you go on?", draft_answer=self.draft, parse_failed=True)
        data = parsed.data
        if not isinstance(data["response"], str):
            # A list, number or null where the message belongs: counted like unparsable output, text kept.
            text = field_text(data["response"]).strip() or raw.strip() or "Can you go on?"
            return UserTurn(text, draft_answer=self.draft, parse_failed=True)
        response = data["response"].strip()
        enforce = _as_bool(data.get("enforce_preferences"))
        if not enforce or self.original:
            self.draft = field_text(data.get("draft_answer")).strip() or self.draft
        if self.original:
            terminate = TERMINATE in response
        else:
            terminate = not enforce and (_as_bool(data.get("should_terminate")) or TERMINATE in response)
        return UserTurn(
            response or TERMINATE, enforce, self.draft, terminate, reasoning=field_text(data.get("reasoning"))
        )

    async def open(self, greeting: str | None = None) -> UserTurn:
        turn = await self._ask([] if greeting is None else [{"role": "assistant", "content": greeting}])
        # Nothing to enforce or end before the agent has spoken.
        return UserTurn(
            turn.response, draft_answer=self.draft, parse_failed=turn.parse_failed, truncated=turn.truncated
        )

    async def reply(self, turns: Sequence[Message]) -> UserTurn:
        return await self._ask(turns)


def _as_bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"true", "yes", "1"}
    return bool(value)


@dataclass(frozen=True)
class LLMUserSimulator(UserSimulator):
    backend: ChatBackend
    sampling: SamplingParams
    original: bool = False

    def start(self, profile: UserProfile, problem: Problem, max_turns: int) -> UserSession:
        return LLMUserSession(profile, problem, max_turns, self.backend, self.sampling, self.original)

    def seeded(self, seed: int) -> LLMUserSimulator:
        return replace(self, sampling=replace(self.sampling, seed=seed))
