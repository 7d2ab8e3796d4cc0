"""Collab sessions as rows to play: the row (user, problem, what the agent knows) and the episodes of a row.

A row is the JSON of one session to play: the user's profile, the problem, the session index and the agent's
knowledge of the user (`none`, or `oracle`: its stated preferences, as the S4 agent of `memrl eval collab`) and
its reply format. The policy is prompted exactly as `CollabAgent` is, so a trained policy is evaluated with `memrl
eval collab --agent` of the same kind and `--reply` of the same format: in `json` the user reads the agent's
`response` (the raw text when it has none, counted in the record's `parse_failures.agent`), in `text` the reply.

`CollabRLConfig` is collab's online section (the `env` of a `collab_grpo` stage): the train-split users and problems
a policy trains on (disjoint from `memrl eval collab`'s), and the user simulator their episodes are played with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from memrl.envs.collab.agents import oracle_notes, read_agent_reply
from memrl.envs.collab.config import CollabEvalConfig
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import Problem
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.prompts import ReplyFormat, agent_messages
from memrl.envs.collab.session import CollabEpisode, SessionSpec, session_key
from memrl.envs.collab.user_sim import LLMUserSimulator, RuleUserSimulator, UserSimulator
from memrl.envs.episode import PolicyReply
from memrl.envs.online import OnlineConfig, PolicyView
from memrl.rollout.base import ChatBackend, Message
from memrl.rollout.builder import build_backend
from memrl.rollout.config import ModelConfig, SamplingConfig

RowAgent = Literal["none", "oracle"]  # what the policy knows of the user: nothing, or its stated preferences


def session_rows(
    users: Sequence[UserProfile], problems: Mapping[str, Sequence[Problem]], agent: RowAgent, reply: ReplyFormat
) -> list[str]:
    """One JSON row per (user, problem), in user order; `problems` maps a user id to that user's sessions."""
    rows = []
    for user in users:
        notes = oracle_notes(user.preferences) if agent == "oracle" else ""
        for index, problem in enumerate(problems[user.id]):
            row = {
                "key": session_key(user.id, index),
                "profile": user.to_record(),
                "problem": problem.to_record(),
                "session": index,
                "agent": agent,
                "notes": notes,
                "reply": reply,
            }
            rows.append(json.dumps(row))
    return rows


def read_reply(raw: str, reply: ReplyFormat = "json") -> PolicyReply:
    """The agent's reply -> the message the user reads (as `CollabAgent.reply` reads it)."""
    text, parse_failed = read_agent_reply(raw, reply)
    return text, {"parse_failed": parse_failed}


def row_context(row: Mapping[str, Any], reply_tokens: int) -> list[Message]:
    """The policy's context for a row: the agent's system prompt (the agent kinds `none` and `oracle` name their
    prompt sections too) in the row's reply format (rows written before formats existed reply in JSON)."""
    return agent_messages(row["agent"], row["notes"], [], reply_tokens, row.get("reply", "json"))


def policy_view(spec: str, reply_tokens: int) -> PolicyView:
    """How the policy sees a row's session and how its reply is read. No user simulator is needed for it."""
    row = json.loads(spec)
    opening: list[Message] = [{"role": "user", "content": row["problem"]["question"]}]
    return PolicyView(row_context(row, reply_tokens), partial(read_reply, reply=row.get("reply", "json")), opening)


class CollabEpisodes:
    """Collab's `Episodes`: a fresh `CollabEpisode` (with its own user session) for every rollout of a row."""

    def __init__(
        self, simulator: UserSimulator, grader: Grader, max_turns: int, backends: Sequence[ChatBackend] = ()
    ) -> None:
        self.simulator = simulator
        self.grader = grader
        self.max_turns = max_turns
        self._backends = list(backends)  # what `close` releases: the LLM user's model

    def episode(self, spec: str) -> CollabEpisode:
        row = json.loads(spec)
        session = SessionSpec(
            UserProfile.from_record(row["profile"]), Problem.from_record(row["problem"]), int(row["session"])
        )
        return CollabEpisode(session, self.simulator, self.grader, self.max_turns)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()


class CollabRLConfig(OnlineConfig):
    """The sessions a policy trains on: train-split users and problems (disjoint from `memrl eval collab`'s)."""

    task: str = Field(default="arith", description="problem set: arith (shipped), math-500, logiqa, mmlu, medqa, ...")
    problems: Path | None = Field(default=None, description="local JSON/JSONL/parquet or cache folder; default: hub")
    eval_problems: PositiveInt = Field(default=100, description="problems held out for eval, never trained on")
    resplit: bool = Field(
        default=False, description="as `memrl eval collab --resplit`: set it the same way on both, or they overlap"
    )
    users: PositiveInt = Field(default=8, description="train users, each with a persona and three preferences")
    sessions: PositiveInt = Field(default=4, description="problems per user: rows are users x sessions")
    max_turns: PositiveInt = Field(default=4, description="agent replies per episode")
    agent: RowAgent = Field(
        default="none", description="what the policy knows of the user: nothing, or its stated preferences"
    )
    reply: ReplyFormat = Field(
        default="json", description="how the policy replies: json (the agent's contract) | text (the message alone)"
    )
    preferences: list[str] | None = Field(
        default=None, description="users hold only these preference ids (train and held-out alike); default: all 20"
    )
    simulator: Literal["rule", "llm"] = Field(default="rule", description="the user: rule (checkers) | llm")
    user_model: ModelConfig | None = Field(default=None, description="the LLM user's model (simulator: llm)")
    user_sampling: SamplingConfig = SamplingConfig(temperature=1.0, max_tokens=256, seed=0)
    seed: int = Field(default=0, description="seed of users, problems and the rule user")
    workers: PositiveInt | None = Field(
        default=None, description="step the episodes' users on this many Ray actors; null: in-process"
    )
    ray_address: str | None = Field(default=None, description="Ray cluster of the actors; default: a local Ray")

    @model_validator(mode="after")
    def _user_model_for_llm(self) -> CollabRLConfig:
        if self.simulator == "llm" and self.user_model is None:
            raise ValueError("simulator llm needs a user_model")
        return self

    def eval_config(self) -> CollabEvalConfig:
        """The evaluation config whose train split these rows are drawn from."""
        return CollabEvalConfig(
            task=self.task,
            problems=self.problems,
            split="train",
            eval_problems=self.eval_problems,
            resplit=self.resplit,
            users=self.users,
            sessions=self.sessions,
            seed=self.seed,
            reply=self.reply,
            preferences=self.preferences,
        )

    def rows(self) -> list[str]:
        """One JSON spec per (train user, session), in user order."""
        from memrl.envs.collab.runner import assign_problems, select_problems, select_profiles  # the driver's world

        evaluation = self.eval_config()
        users = select_profiles(evaluation)
        plan = assign_problems(users, select_problems(evaluation), self.sessions, self.seed)
        return session_rows(users, plan, self.agent, self.reply)

    def episodes(self) -> CollabEpisodes:
        """Arith, maths and choice tasks are graded by rule, so no judge model is needed."""
        grader = Grader()
        if self.user_model is None or self.simulator == "rule":
            return CollabEpisodes(RuleUserSimulator(grader, seed=self.seed), grader, self.max_turns)
        backend = build_backend(self.user_model)
        simulator = LLMUserSimulator(backend, self.user_sampling.params())
        return CollabEpisodes(simulator, grader, self.max_turns, [backend])

    def plays(self) -> str:
        return (
            f"with a {self.simulator} user on {self.task} ({self.users} train users x {self.sessions} sessions, up to "
            f"{self.max_turns} replies)"
        )
