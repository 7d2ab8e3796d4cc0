"""The world of a reflection's next session: the row's user, the problem drawn for it, the agent that reads the
notes, and how preferences are graded in a session.

For one row: the row's user (its three preferences) meets an agent in a next session on a fixed problem drawn from
the row (never the row's own problem). A session's share is, per agent reply, the share of the user's preferences it
does not violate, averaged over the replies (graded as the collab reward's `preference` part): the programmatic
checkers decide what they can, an optional LLM judge the judge-only preferences (without one those count as not
violated). The reward built on it, which plays these sessions with and without notes, is
memrl.train.rewards.next_session.

`oracle_notes` (envs/collab/agents.py) and `wrong_preferences` write the notes that calibrate the signal before it
ranks reflectors (the user's true preferences, and preferences it does not hold).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from memrl.core.asyncs import in_own_thread
from memrl.core.errors import ConfigError
from memrl.core.files import read_jsonl
from memrl.core.preferences import TAXONOMY, get_preference
from memrl.envs.collab.agents import read_agent_reply
from memrl.envs.collab.checkers import TurnContext, Verdict, is_clarifying_question
from memrl.envs.collab.problems import Problem
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.prompts import ReplyFormat, agent_messages
from memrl.envs.collab.records import Turn
from memrl.envs.collab.user_sim import checker_verdicts
from memrl.rewards.collab_episode import met_share
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, parse_json_object


class NoteAgent(Protocol):
    """The agent of the next session: one reply per (notes, conversation so far), the whole batch at once."""

    name: str

    async def replies(self, requests: Sequence[tuple[str, list[Message]]]) -> list[str]: ...


class PreferenceJudge(Protocol):
    """Decides judge-only preferences: per (preference id, reply) True (violated), False, or None (cannot tell)."""

    async def violated(self, items: Sequence[tuple[str, str]]) -> list[bool | None]: ...


@dataclass(frozen=True)
class NextSessionRow:
    """What a reflection row tells about its user's next session."""

    key: str
    user_id: str
    preferences: tuple[str, ...]
    task: str
    problem_id: str  # the row's own session's problem, never drawn again
    session: int

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NextSessionRow:
        """From a reflection record (a line of the dataset's train.jsonl / eval.jsonl)."""
        try:
            return cls(
                str(record["key"]),
                str(record["user_id"]),
                tuple(str(p) for p in record["preferences"]),
                str(record["task"]),
                str(record["problem_id"]),
                int(record["session"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"reflection record {record.get('key')!r} lacks a user field: {exc}") from None

    def profile(self) -> UserProfile:
        # The rule user reads only the id (its seed) and the preferences; the persona is for an LLM user.
        return UserProfile(self.user_id, "", self.preferences)  # type: ignore[arg-type]


def load_rows(data_dir: str | Path) -> dict[str, NextSessionRow]:
    """Rows by key from a reflection_data folder's train.jsonl and eval.jsonl."""
    folder = Path(data_dir)
    files = [folder / f"{split}.jsonl" for split in ("train", "eval") if (folder / f"{split}.jsonl").is_file()]
    if not files:
        raise ConfigError(f"outcome reward: no train.jsonl or eval.jsonl in {folder} (a reflection_data folder)")
    rows: dict[str, NextSessionRow] = {}
    for path in files:
        for record in read_jsonl(path, ConfigError):
            row = NextSessionRow.from_record(record)
            rows[row.key] = row
    return rows


@dataclass(frozen=True)
class SessionOutcome:
    share: float  # per reply the share of the user's preferences met, averaged over the replies
    replies: int
    user_effort: int  # the rule user's enforcing turns
    task_success: int


def wrong_preferences(user_id: str, preferences: Sequence[str]) -> tuple[str, ...]:
    """One preference the user does not hold per preference it does: the opposite where there is one, else another
    of the same category drawn from the user id (so notes built on them are fixed per user). Never one of the
    user's own, never one twice."""
    held, chosen = set(preferences), []
    for pid in preferences:
        pref = get_preference(pid)
        free = [q for q in TAXONOMY if q not in held and q not in chosen]
        kin = [q for q in free if TAXONOMY[q].category == pref.category]
        if pref.opposite in free:
            chosen.append(pref.opposite)
        elif pool := kin or free:
            digest = hashlib.sha256(f"{user_id}|{pid}".encode()).digest()
            chosen.append(pool[int.from_bytes(digest[:8], "big") % len(pool)])
    return tuple(chosen)


def next_problem(row: NextSessionRow, problems: Sequence[Problem], seed: int) -> Problem:
    """The next session's problem: drawn from the row's key and the seed, never the row's own problem."""
    pool = [p for p in problems if p.id != row.problem_id] or list(problems)
    if not pool:
        raise ConfigError(f"outcome reward: task {row.task!r} has no problems")
    digest = hashlib.sha256(f"{seed}|{row.key}".encode()).digest()
    return pool[int.from_bytes(digest[:8], "big") % len(pool)]


async def session_share(turns: Sequence[Turn], profile: UserProfile, judge: PreferenceJudge | None) -> float:
    """Per agent reply of `turns`, the share of the user's preferences it does not violate; their mean (graded as
    the collab reward's `preference` part is, so a reader that meets one preference more than before is seen). The
    last reply is checked as the conversation winds down (when `takeaways` applies)."""
    replies = [t["content"] for t in turns if t["role"] == "assistant"]
    if not replies:
        return 0.0
    broken: list[set[str]] = []
    judged: list[tuple[int, str, str]] = []
    for i, reply in enumerate(replies):
        context = TurnContext(winding_down=i == len(replies) - 1, clarifying=is_clarifying_question(reply))
        verdicts = checker_verdicts(profile, reply, context)
        broken.append({pid for pid, v in verdicts.items() if v is Verdict.VIOLATED})
        judged += [(i, pid, reply) for pid in profile.preferences if not get_preference(pid).checkable]
    if judge is not None and judged:
        for (i, pid, _), violated in zip(judged, await judge.violated([(p, r) for _, p, r in judged]), strict=True):
            if violated is True:
                broken[i].add(pid)
    return met_share(broken, len(profile.preferences))


class ModelAgent:
    """The collab policy's prompt with the notes in its system prompt (as `CollabAgent` keeps them) over any
    backend; the batch is one `generate` call, off the event loop. `reply`: the policy's reply format, so a policy
    trained with `collab_grpo` reads the notes and replies here as it learned to."""

    def __init__(
        self, backend: ChatBackend, sampling: SamplingParams, name: str = "model", reply: ReplyFormat = "json"
    ) -> None:
        self.backend = backend
        self.sampling = sampling
        self.name = name
        self.reply = reply

    async def replies(self, requests: Sequence[tuple[str, list[Message]]]) -> list[str]:
        budget = self.sampling.max_tokens
        prompts = [agent_messages("notes", notes, turns, budget, self.reply) for notes, turns in requests]
        done = await in_own_thread(self.backend.generate, prompts, self.sampling)
        return [read_agent_reply(completion.text, self.reply)[0] for completion in done]


_JUDGE_PROMPT = """Does this assistant reply satisfy the user's preference?

Preference: {preference}

Reply:
{reply}

Answer with one JSON object and nothing else: {{"satisfied": true}} or {{"satisfied": false}}"""


class LLMPreferenceJudge:
    """Yes/no per (judge-only preference, reply) from any backend; an unreadable answer leaves it undecided."""

    def __init__(self, backend: ChatBackend, sampling: SamplingParams | None = None) -> None:
        self.backend = backend
        self.sampling = sampling or SamplingParams(temperature=0.0, max_tokens=32)

    async def violated(self, items: Sequence[tuple[str, str]]) -> list[bool | None]:
        prompts: list[list[Message]] = [
            [{"role": "user", "content": _JUDGE_PROMPT.format(preference=get_preference(p).description, reply=r)}]
            for p, r in items
        ]
        done = await in_own_thread(self.backend.generate, prompts, self.sampling)
        out: list[bool | None] = []
        for completion in done:
            parsed = parse_json_object(completion.text, required=("satisfied",))
            value = None if isinstance(parsed, JSONParseFailure) else parsed.data["satisfied"]
            out.append(not value if isinstance(value, bool) else None)
        return out
