"""Several sessions of one user as one `Episode`: the agent's notes carry from each session to the next.

`MultiSessionEpisode` plays a user's sessions in order, each a `CollabEpisode` (the one session loop; nothing here
steps a user itself). The policy sees every session behind the system prompt of an agent that keeps notes
(`agent_messages("notes", ...)`), the notes so far in it. Between two sessions the notes are rewritten by the
`reflector`:
- `policy`: the policy itself; the step that ends a session returns the reflection prompt (`reflection_messages`,
  the prompt memrl's reflectors are trained on) as the observation, and the next reply is the reflection, read as
  `Reflector` reads one (`agent_notes`; unreadable, the old notes are kept);
- `oracle`: the user's stated preferences (`oracle_notes`), the notes a perfect reflector would write;
- `empty`: no notes at all, the baseline the notes are measured against.

The reward is what the notes earn later: on the last step, `preference` is the share of the user's preferences the
agent's replies met (per reply, as the collab reward's part and the next-session outcome grade it), averaged over
the sessions after the first; `first_preference` is the first session's, and `task_success`, `user_effort` and
`length` are the sessions' means. `reset(seed=s)` seeds session k's user with s + k. The record holds every
session's `CollabEpisode` record and the notes each began with.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Any, Literal

from memrl.envs.collab.agents import oracle_notes, read_reflection
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.next_session import session_share
from memrl.envs.collab.prompts import ReplyFormat, agent_messages, reflection_messages
from memrl.envs.collab.session import MAX_TURNS, CollabEpisode, SessionSpec
from memrl.envs.collab.user_sim import UserSimulator
from memrl.envs.episode import Step, check_step
from memrl.rollout.base import Message

ReflectorKind = Literal["policy", "oracle", "empty"]
REFLECTORS: tuple[ReflectorKind, ...] = ("policy", "oracle", "empty")


class MultiSessionEpisode:
    """A user's sessions as one episode, the notes carried between them (see the module).

    `step(reply, **annotations)` takes what `CollabEpisode.step` takes while a session runs; in a reflection (the
    observation is the reflection prompt, `info["phase"] == "reflect"`) it takes the reflection and no annotation.
    `info` always has `session` (0-based), `phase` (`reply` or `reflect`) and `notes` (what the agent knows now).
    """

    def __init__(
        self,
        specs: Sequence[SessionSpec],
        simulator: UserSimulator,
        grader: Grader,
        *,
        reflector: ReflectorKind = "policy",
        max_turns: int = MAX_TURNS,
        reply_tokens: int = 256,
        reply: ReplyFormat = "text",
    ) -> None:
        if not specs:
            raise ValueError("a multi-session episode needs at least one session")
        if len({spec.profile.id for spec in specs}) != 1:
            raise ValueError("a multi-session episode is one user's sessions")
        if reflector not in REFLECTORS:
            raise ValueError(f"unknown reflector {reflector!r} (choose from {', '.join(REFLECTORS)})")
        self.specs = list(specs)
        self.reflector = reflector
        self.max_turns = max_turns
        self.reply_tokens = reply_tokens
        self.reply = reply
        self._simulator = simulator
        self._grader = grader
        self._seed: int | None = None
        self._session: CollabEpisode | None = None  # None until reset
        self._index = 0
        self._reflecting = False
        self._notes = ""
        self._records: list[dict[str, Any]] = []
        self._shares: list[float] = []
        self._done = False

    def _view(self, turns: Sequence[Message]) -> list[Message]:
        return agent_messages("notes", self._notes, turns, self.reply_tokens, self.reply)

    def _info(self, phase: str) -> dict[str, Any]:
        return {"session": self._index, "phase": phase, "notes": self._notes}

    async def _open(self, index: int) -> list[Message]:
        self._index, self._reflecting = index, False
        self._session = CollabEpisode(self.specs[index], self._simulator, self._grader, self.max_turns)
        seed = None if self._seed is None else self._seed + index
        return self._view(await self._session.reset(seed=seed))

    async def reset(self, *, seed: int | None = None) -> list[Message]:
        self._seed, self._notes, self._records, self._shares, self._done = seed, "", [], [], False
        return await self._open(0)

    async def step(self, reply: str, **annotations: Any) -> Step:
        session = check_step(self, {}, self._session, over=self._done)
        if self._reflecting:
            check_step(self, annotations, session, over=False)
            self._notes = read_reflection(reply, self._notes).notes
            observation = await self._open(self._index + 1)
            return Step(observation, info=self._info("reply"))
        step = await session.step(reply, **annotations)
        info = step.info | self._info("reply")
        if not step.done:
            return Step(self._view(step.observation), info=info)
        played = session.outcome()
        share = await session_share(played.turns, self.specs[self._index].profile, None)
        self._records.append(played.to_dict() | {"notes_before": self._notes, "preference": share})
        self._shares.append(share)
        ended = info | {"ended_session": self._index, "session_reward": step.reward | {"preference": share}}
        if self._index + 1 == len(self.specs):
            self._done = True
            ending = {"terminated": step.terminated, "truncated": step.truncated}
            return Step(self._view(step.observation), self._reward(), **ending, info=ended)
        if self.reflector == "policy":
            self._reflecting = True
            prompt = reflection_messages(self._notes, step.observation)
            return Step(prompt, info=ended | {"phase": "reflect"})
        self._notes = oracle_notes(self.specs[0].profile.preferences) if self.reflector == "oracle" else ""
        observation = await self._open(self._index + 1)
        return Step(observation, info=ended | self._info("reply"))

    def _reward(self) -> dict[str, float]:
        later = self._shares[1:] or self._shares
        return {
            "preference": fmean(later),
            "first_preference": self._shares[0],
            **{
                part: fmean(float(r[part]) for r in self._records) for part in ("task_success", "user_effort", "length")
            },
        }

    def record(self) -> dict[str, Any]:
        """Every session's record (with the notes it began with and its preference share) and the episode's reward;
        only once done."""
        if not self._done:
            raise RuntimeError("the episode has no record before its last step")
        return {
            "user_id": self.specs[0].profile.id,
            "reflector": self.reflector,
            "sessions": self._records,
            "notes": self._notes,
            "reward": self._reward(),
        }
