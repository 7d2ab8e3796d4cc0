"""The Proactive Response Strategy: after the confirmation response, fix what it missed or got wrong.

L starts as the goal slots the confirmation response leaves missing or wrong. Each round a user simulator, told the
goal and L, answers the assistant; the reader replies; a supervisor removes from L every slot the conversation now
resolves. The loop ends when L is empty (success) or the assistant has spoken `max_turns` times.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from memrl.envs.tod.formats import Turn, as_dicts
from memrl.envs.tod.metrics import mentions, outstanding_slots
from memrl.envs.tod.pipeline import Inference, parse_slot_list, require_backend
from memrl.envs.tod.prompts import SUPERVISOR_KEYS, supervisor_messages, user_messages
from memrl.envs.tod.reader import Reply, humanise
from memrl.rollout.base import ChatBackend, SamplingParams

Respond = Callable[[Sequence[Turn]], Awaitable[Reply]]  # the loop's turns so far -> the assistant's next reply


@dataclass(frozen=True)
class UserReply:
    turn: Turn
    failed: bool = False


class UserSimulator(ABC):
    @abstractmethod
    async def reply(
        self, conversation: Sequence[Turn], goal: Mapping[str, str], outstanding: Sequence[str]
    ) -> UserReply:
        """The user's answer to the assistant's last turn, knowing the goal and the outstanding slots."""


_CORRECTIONS = (
    "Actually, the {slot} should be {value}.",
    "Not quite: the {slot} is {value}.",
    "Please make the {slot} {value}.",
)


@dataclass(frozen=True)
class RuleUser(UserSimulator):
    """Deterministic: gives the goal value of the first outstanding slot, one slot a turn, annotated on the turn."""

    async def reply(
        self, conversation: Sequence[Turn], goal: Mapping[str, str], outstanding: Sequence[str]
    ) -> UserReply:
        slot = outstanding[0]
        text = _CORRECTIONS[len(conversation) % len(_CORRECTIONS)].format(slot=humanise(slot), value=goal[slot])
        return UserReply(Turn(speaker="user", utterance=text, slots={slot: goal[slot]}))


@dataclass(frozen=True)
class LLMUser(UserSimulator):
    """An LLM plays the user; an empty answer is counted and the rule user speaks for that turn."""

    backend: ChatBackend
    sampling: SamplingParams
    fallback: UserSimulator = field(default_factory=RuleUser)

    async def reply(
        self, conversation: Sequence[Turn], goal: Mapping[str, str], outstanding: Sequence[str]
    ) -> UserReply:
        wanted = {s: goal[s] for s in outstanding}
        messages = user_messages(as_dicts(conversation), goal, wanted)
        text = (await self.backend.achat(messages, self.sampling)).text.strip()
        if not text:
            return UserReply((await self.fallback.reply(conversation, goal, outstanding)).turn, failed=True)
        return UserReply(Turn(speaker="user", utterance=text))


class Supervisor(ABC):
    @abstractmethod
    async def resolved(
        self, conversation: Sequence[Turn], goal: Mapping[str, str], outstanding: Sequence[str]
    ) -> Inference:
        """The outstanding slots the conversation now states correctly (a list of slot names)."""


@dataclass(frozen=True)
class RuleSupervisor(Supervisor):
    """A slot is resolved when the assistant's latest turn states its goal value (normalised string match)."""

    async def resolved(
        self, conversation: Sequence[Turn], goal: Mapping[str, str], outstanding: Sequence[str]
    ) -> Inference:
        latest = next((t.utterance for t in reversed(conversation) if t.speaker == "assistant"), "")
        return Inference([s for s in outstanding if mentions(latest, goal[s])])


@dataclass(frozen=True)
class LLMSupervisor(Supervisor):
    """An LLM judges the outstanding slots; unusable output is counted and the rule decides that turn."""

    backend: ChatBackend
    sampling: SamplingParams
    fallback: Supervisor = field(default_factory=RuleSupervisor)

    async def resolved(
        self, conversation: Sequence[Turn], goal: Mapping[str, str], outstanding: Sequence[str]
    ) -> Inference:
        messages = supervisor_messages(as_dicts(conversation), {s: goal[s] for s in outstanding})
        raw = (await self.backend.achat(messages, self.sampling)).text
        # An empty list is a usable verdict (nothing resolved yet); names outside L are ignored.
        parsed = parse_slot_list(raw, SUPERVISOR_KEYS[0], outstanding)
        if parsed is None:
            fallback = await self.fallback.resolved(conversation, goal, outstanding)
            return Inference(fallback.value, failed=True)
        return Inference(parsed[0], reasoning=parsed[1])


@dataclass(frozen=True)
class Outcome:
    confirmation: Reply
    turns: list[Turn]  # the confirmation response and every turn after it
    outstanding: list[list[str]]  # L after each assistant turn; [0] is after the confirmation
    dte: int  # assistant turns to complete the task; max_turns when it never completes
    success: bool
    failures: dict[str, int]


async def run_proactive(
    respond: Respond,
    context: Sequence[Turn],
    goal: Mapping[str, str],
    user: UserSimulator,
    supervisor: Supervisor,
    max_turns: int = 10,
) -> Outcome:
    """Confirmation response, then user / assistant / supervisor rounds until L is empty or the turn limit."""
    failures = {"reader": 0, "user": 0, "supervisor": 0}
    confirmation = await respond([])
    failures["reader"] += confirmation.failed
    turns = [Turn(speaker="assistant", utterance=confirmation.text, slots=confirmation.slots)]
    left = outstanding_slots(confirmation.text, goal)
    history = [list(left)]
    spoken = 1
    while left and spoken < max_turns:
        answer = await user.reply([*context, *turns], goal, left)
        failures["user"] += answer.failed
        turns.append(answer.turn)
        reply = await respond(turns)
        failures["reader"] += reply.failed
        turns.append(Turn(speaker="assistant", utterance=reply.text, slots=reply.slots))
        spoken += 1
        verdict = await supervisor.resolved([*context, *turns], goal, left)
        failures["supervisor"] += verdict.failed
        left = [s for s in left if s not in verdict.value]
        history.append(list(left))
    success = not left
    return Outcome(confirmation, turns, history, spoken if success else max_turns, success, failures)


USERS: Mapping[str, Callable[[ChatBackend | None, SamplingParams], UserSimulator]] = {
    "rule": lambda backend, sampling: RuleUser(),
    "llm": lambda backend, sampling: LLMUser(require_backend(backend, "user simulator"), sampling),
}

SUPERVISORS: Mapping[str, Callable[[ChatBackend | None, SamplingParams], Supervisor]] = {
    "rule": lambda backend, sampling: RuleSupervisor(),
    "llm": lambda backend, sampling: LLMSupervisor(require_backend(backend, "supervisor"), sampling),
}
