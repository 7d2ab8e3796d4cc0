"""The Proactive Response Strategy: after the confirmation response, fix what it missed or got wrong.

L starts as the goal slots the confirmation response leaves missing or wrong. Each round a user simulator, told the
goal and L, answers the assistant; the reader replies; a supervisor removes from L every slot the conversation now
resolves. The loop ends when L is empty (success) or the assistant has spoken `max_turns` times.

`ProactiveEpisode` is the loop as an `Episode` (memrl.envs.episode), stepped one assistant reply at a time;
`run_proactive` is a reader playing it: its policy reads the observation, whose turns carry their slot annotations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from memrl.envs.episode import PolicyReply, Step, check_step, play
from memrl.envs.tod.formats import Turn, as_dicts
from memrl.envs.tod.metrics import outstanding_slots
from memrl.envs.tod.pipeline import Inference, parse_slot_list, require_backend
from memrl.envs.tod.prompts import SUPERVISOR_KEYS, supervisor_messages, user_messages
from memrl.envs.tod.reader import Reply, humanise
from memrl.envs.tod.values import mentions
from memrl.rollout.base import ChatBackend, Message, SamplingParams

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


class TurnMessage(Message, total=False):
    slots: dict[str, str]  # the turn's slot annotation, where it has one


def as_messages(turns: Sequence[Turn]) -> list[Message]:
    """Turns as the chat messages a policy reads: the speaker is the role, the utterance the content, and the
    turn's slot annotation (a rule user's, a template reader's) as `slots` where it has one, so a reader that reads
    annotations reads them from the observation."""
    out: list[Message] = []
    for t in turns:
        message: TurnMessage = {"role": t.speaker, "content": t.utterance}
        if t.slots:
            message["slots"] = dict(t.slots)
        out.append(message)
    return out


def as_turns(messages: Sequence[Message]) -> list[Turn]:
    """`as_messages` undone: the turns an observation shows, annotations included."""
    turns = (cast(TurnMessage, m) for m in messages)
    return [
        Turn.model_validate({"speaker": m["role"], "utterance": m["content"], "slots": m.get("slots", {})})
        for m in turns
    ]


class ProactiveEpisode:
    """The proactive loop as an `Episode`: each step is one assistant reply, then the user and the supervisor act.

    `reset` returns the dialogue context (as messages, `as_messages`: each with its turn's slot annotation). The
    first step is the confirmation response: L becomes the goal slots it leaves missing or wrong. Every later step
    is a reply to the user's answer, after which the supervisor removes from L what the conversation now resolves.
    Until the episode ends, the observation closes with the user's next answer (told the goal and L).
    `step(reply, slots=None, parse_failed=False)`: `slots` are the values the reply states when the reader knows
    them (kept on its turn, which later observations show), `parse_failed` counts a reader failure. The episode ends
    when L is empty (termination) or after `max_turns` replies (truncation); the last step carries the reward parts
    `success` (0/1) and `dte` (assistant turns to complete the task, `max_turns` when it never completes), earlier
    steps none. `info` has `outstanding` (L after the reply), and on the last step `ended_by` ("resolved" or
    "max_turns"). `outcome()` is the finished loop as an `Outcome`. The loop draws nothing at `reset`: the rule user
    and supervisor are deterministic and the LLM ones sample with the seed their `SamplingParams` were built with,
    so every seed (None too) plays alike.
    """

    def __init__(
        self,
        context: Sequence[Turn],
        goal: Mapping[str, str],
        user: UserSimulator,
        supervisor: Supervisor,
        max_turns: int = 10,
    ) -> None:
        self.context = list(context)
        self.goal = goal
        self.max_turns = max_turns
        self._user = user
        self._supervisor = supervisor
        self._started = False
        self._outcome: Outcome | None = None  # set by the last step
        self._confirmation: Reply | None = None
        self._turns: list[Turn] = []
        self._left: list[str] = []
        self._history: list[list[str]] = []
        self._failures = {"reader": 0, "user": 0, "supervisor": 0}

    def _observation(self) -> list[Message]:
        return as_messages([*self.context, *self._turns])

    async def reset(self, *, seed: int | None = None) -> list[Message]:
        """Start the loop afresh and return the dialogue context (`seed` changes nothing: see the class)."""
        self._started, self._outcome, self._confirmation = True, None, None
        self._turns, self._left, self._history = [], [], []
        self._failures = {"reader": 0, "user": 0, "supervisor": 0}
        return self._observation()

    async def step(
        self, reply: str, *, slots: Mapping[str, str] | None = None, parse_failed: bool = False, **unknown: Any
    ) -> Step:
        check_step(self, unknown, self._started or None, over=self._outcome is not None)
        said = Reply(reply, dict(slots or {}), parse_failed)
        self._failures["reader"] += parse_failed
        self._turns.append(Turn(speaker="assistant", utterance=said.text, slots=said.slots))
        if self._confirmation is None:
            self._confirmation = said
            self._left = outstanding_slots(said.text, self.goal)
        else:
            verdict = await self._supervisor.resolved([*self.context, *self._turns], self.goal, self._left)
            self._failures["supervisor"] += verdict.failed
            self._left = [s for s in self._left if s not in verdict.value]
        self._history.append(list(self._left))
        spoken = len(self._history)
        info: dict[str, Any] = {"outstanding": list(self._left)}
        if self._left and spoken < self.max_turns:
            answer = await self._user.reply([*self.context, *self._turns], self.goal, self._left)
            self._failures["user"] += answer.failed
            self._turns.append(answer.turn)
            return Step(self._observation(), info=info)
        success = not self._left
        dte = spoken if success else self.max_turns
        self._outcome = Outcome(self._confirmation, list(self._turns), self._history, dte, success, self._failures)
        reward = {"success": float(success), "dte": float(dte)}
        ended_by = "resolved" if success else "max_turns"
        return Step(self._observation(), reward, success, not success, info | {"ended_by": ended_by})

    def outcome(self) -> Outcome:
        """The finished loop; only once done."""
        if self._outcome is None:
            raise RuntimeError("the episode has no outcome before its last step")
        return self._outcome

    def record(self) -> dict[str, Any]:
        """The loop's record (plain JSON): the goal, confirmation, turns, L after each reply, dte, success,
        failures."""
        outcome = self.outcome()
        return {
            "goal": dict(self.goal),
            "confirmation": outcome.confirmation.text,
            "turns": [t.model_dump(exclude_defaults=True) for t in outcome.turns],
            "outstanding": outcome.outstanding,
            "dte": outcome.dte,
            "success": outcome.success,
            "failures": dict(outcome.failures),
        }


async def run_proactive(
    respond: Respond,
    context: Sequence[Turn],
    goal: Mapping[str, str],
    user: UserSimulator,
    supervisor: Supervisor,
    max_turns: int = 10,
) -> Outcome:
    """Confirmation response, then user / assistant / supervisor rounds until L is empty or the turn limit."""
    episode = ProactiveEpisode(context, goal, user, supervisor, max_turns)

    async def policy(observation: list[Message]) -> PolicyReply:
        reply = await respond(as_turns(observation[len(context) :]))  # the loop's turns follow the context
        return reply.text, {"slots": reply.slots, "parse_failed": reply.failed}

    await play(episode, policy)
    return episode.outcome()


USERS: Mapping[str, Callable[[ChatBackend | None, SamplingParams], UserSimulator]] = {
    "rule": lambda backend, sampling: RuleUser(),
    "llm": lambda backend, sampling: LLMUser(require_backend(backend, "user simulator"), sampling),
}

SUPERVISORS: Mapping[str, Callable[[ChatBackend | None, SamplingParams], Supervisor]] = {
    "rule": lambda backend, sampling: RuleSupervisor(),
    "llm": lambda backend, sampling: LLMSupervisor(require_backend(backend, "supervisor"), sampling),
}
