"""Collab sessions as rows to play: the row (user, problem, what the agent knows) and the episodes of a row.

A row is the JSON of one session to play: the user's profile, the problem, the session index and the agent's
knowledge of the user (`none`, or `oracle`: its stated preferences, as the S4 agent of `memrl eval collab`) and
its reply format. The policy is prompted exactly as `CollabAgent` is, so a trained policy is evaluated with `memrl
eval collab --agent` of the same kind and `--reply` of the same format: in `json` the user reads the agent's
`response` (the raw text when it has none, counted in the record's `parse_failures.agent`), in `text` the reply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Literal

from memrl.envs.collab.agents import oracle_notes, read_agent_reply
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import Problem
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.prompts import ReplyFormat, agent_messages
from memrl.envs.collab.session import CollabEpisode, SessionSpec, session_key
from memrl.envs.collab.user_sim import UserSimulator
from memrl.envs.episode import PolicyReply
from memrl.envs.online import OnlineEpisode, PolicyView
from memrl.rollout.base import ChatBackend, Message

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
    return PolicyView(row_context(row, reply_tokens), partial(read_reply, reply=row.get("reply", "json")))


class CollabEpisodes:
    """An `EpisodeSource`: a fresh `CollabEpisode` (with its own user session) for every rollout of a row."""

    def __init__(
        self,
        simulator: UserSimulator,
        grader: Grader,
        max_turns: int,
        reply_tokens: int,
        backends: Sequence[ChatBackend] = (),
    ) -> None:
        self.simulator = simulator
        self.grader = grader
        self.max_turns = max_turns
        self.reply_tokens = reply_tokens  # the budget the agent prompt states
        self._backends = list(backends)  # what `close` releases: the LLM user's model

    def episode(self, spec: str) -> CollabEpisode:
        row = json.loads(spec)
        session = SessionSpec(
            UserProfile.from_record(row["profile"]), Problem.from_record(row["problem"]), int(row["session"])
        )
        return CollabEpisode(session, self.simulator, self.grader, self.max_turns)

    def __call__(self, spec: str) -> OnlineEpisode:
        view = policy_view(spec, self.reply_tokens)
        return OnlineEpisode(self.episode(spec), view.context, view.read_reply)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
