"""The next-session outcome reward of a reflection: what its notes do for the user's next session.

For one (notes, row): the row's user (its three preferences) meets an agent in a next session on a fixed problem
drawn from the row (never the row's own problem), played with the rule user for `max_turns` replies, once with the
notes in the agent's system prompt and once with none (the counterfactual baseline). A session's share is, per
agent reply, the share of the user's preferences it does not violate, averaged over the replies (graded as the
collab reward's `preference` part): the programmatic checkers decide what they can, an optional LLM judge the
judge-only preferences (without one those count as not violated). The reward is the share with the notes minus the
share without, in [-1, 1].

Sessions are cached by (row, sha256 of the notes) (the baseline is the entry of the empty notes) and played in lock
step: each round sends every live session's next reply to the agent in one batch (one `generate` call of the
agent's backend). A session that fails (its agent or user raised) gives None, never 0, and is not cached.

`oracle_notes` (envs/collab/agents.py) and `wrong_preferences` write the notes that calibrate the signal before it
ranks reflectors (the user's true preferences, and preferences it does not hold: train/outcome_reward.py).

Placement: this runs collab sessions, so it lives in envs; `memrl.rewards` (a layer below) holds only its config.
The trainer adapters are `outcome_trl` and `outcome_verl` beside it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import Any, Protocol

from memrl.core.errors import ConfigError
from memrl.core.files import read_jsonl
from memrl.core.preferences import TAXONOMY, get_preference
from memrl.envs.collab.agents import read_agent_reply
from memrl.envs.collab.checkers import TurnContext, Verdict, is_clarifying_question
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import Problem, load_problems
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.prompts import ReplyFormat, agent_messages
from memrl.envs.collab.session import CollabEpisode, SessionSpec
from memrl.envs.collab.user_sim import RuleUserSimulator, checker_verdicts
from memrl.rewards.collab_outcome import met_share
from memrl.rewards.config import OutcomeRewardConfig
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, parse_json_object

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class OutcomeParts:
    """The reward of one (notes, row) and what it is made of; `score` None: a session failed (see `error`)."""

    score: float | None
    with_notes: float | None
    without_notes: float | None
    effort_with: int | None = None
    effort_without: int | None = None
    error: str = ""

    @property
    def failed(self) -> bool:
        return self.score is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"failed": self.failed}


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


def notes_hash(notes: str) -> str:
    return hashlib.sha256(notes.strip().encode()).hexdigest()


def next_problem(row: NextSessionRow, problems: Sequence[Problem], seed: int) -> Problem:
    """The next session's problem: drawn from the row's key and the seed, never the row's own problem."""
    pool = [p for p in problems if p.id != row.problem_id] or list(problems)
    if not pool:
        raise ConfigError(f"outcome reward: task {row.task!r} has no problems")
    digest = hashlib.sha256(f"{seed}|{row.key}".encode()).digest()
    return pool[int.from_bytes(digest[:8], "big") % len(pool)]


async def session_share(record: Mapping[str, Any], profile: UserProfile, judge: PreferenceJudge | None) -> float:
    """Per agent reply, the share of the user's preferences it does not violate; their mean (graded as the collab
    reward's `preference` part is, so a reader that meets one preference more than before is seen). The last reply
    is checked as the conversation winds down (when `takeaways` applies)."""
    replies = [t["content"] for t in record["turns"] if t["role"] == "assistant"]
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


class NextSessionScorer:
    """Scores (notes, row) pairs by their next session; build once per process and reuse (it caches sessions)."""

    def __init__(
        self,
        agent: NoteAgent,
        *,
        max_turns: int = 2,
        seed: int = 0,
        problems: Path | None = None,
        judge: PreferenceJudge | None = None,
        cache_size: int = 65536,
        backends: Sequence[ChatBackend] = (),
    ) -> None:
        self.agent = agent
        self._backends = list(backends)  # what `close` releases
        self.max_turns = max_turns
        self.seed = seed
        self.problems_source = problems
        self.judge = judge
        self.grader = Grader()
        self.simulator = RuleUserSimulator(self.grader, seed=seed)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], SessionOutcome] = OrderedDict()
        self._problems: dict[str, list[Problem]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.sessions = 0  # sessions played (cache misses that finished)
        self.failures = 0

    def _problem(self, row: NextSessionRow) -> Problem:
        if row.task not in self._problems:
            self._problems[row.task] = load_problems(row.task, self.problems_source, seed=self.seed)
        return next_problem(row, self._problems[row.task], self.seed)

    def _cached(self, key: tuple[str, str]) -> SessionOutcome | None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
            return hit

    def _store(self, key: tuple[str, str], outcome: SessionOutcome) -> None:
        if self.cache_size <= 0:
            return
        with self._lock:
            self._cache[key] = outcome
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    async def ascore(self, items: Sequence[tuple[str, NextSessionRow]]) -> list[OutcomeParts]:
        """One OutcomeParts per (notes, row), in order; every session not cached is played in one lock-step batch."""
        wanted = {(row.key, notes_hash(n)): (n.strip(), row) for notes, row in items for n in (notes, "")}
        known: dict[tuple[str, str], SessionOutcome | BaseException] = {}
        todo = []
        for key, job in wanted.items():
            hit = self._cached(key)
            if hit is None:
                todo.append((key, job))
            else:
                known[key] = hit
        played = await self.play([job for _, job in todo])
        for (key, _), outcome in zip(todo, played, strict=True):
            known[key] = outcome
            if isinstance(outcome, SessionOutcome):
                self._store(key, outcome)
        parts = [
            self._parts(known[(row.key, notes_hash(notes))], known[(row.key, notes_hash(""))]) for notes, row in items
        ]
        with self._lock:
            self.sessions += sum(isinstance(o, SessionOutcome) for o in played)
            self.failures += sum(p.failed for p in parts)
        if failed := [p for p in parts if p.failed]:
            log.warning(
                "outcome reward: %d of %d samples have no reward, e.g. %s", len(failed), len(parts), failed[0].error
            )
        return parts

    @staticmethod
    def _parts(with_notes: SessionOutcome | BaseException, without: SessionOutcome | BaseException) -> OutcomeParts:
        for outcome in (with_notes, without):
            if isinstance(outcome, BaseException):
                return OutcomeParts(None, None, None, error=f"{type(outcome).__name__}: {outcome}")
        assert isinstance(with_notes, SessionOutcome) and isinstance(without, SessionOutcome)
        score = round(with_notes.share - without.share, 6)
        return OutcomeParts(score, with_notes.share, without.share, with_notes.user_effort, without.user_effort)

    async def play(self, jobs: Sequence[tuple[str, NextSessionRow]]) -> list[SessionOutcome | BaseException]:
        """Play the next session of each (notes, row) in lock step; an exception stands for a failed session."""
        results: list[SessionOutcome | BaseException | None] = [None] * len(jobs)
        episodes: list[CollabEpisode | None] = []
        for n, (_, row) in enumerate(jobs):
            try:
                spec = SessionSpec(row.profile(), self._problem(row), row.session + 1)
                episodes.append(CollabEpisode(spec, self.simulator, self.grader, self.max_turns))
            except Exception as exc:  # a row whose user or problem cannot be built: that sample has no reward
                results[n] = exc
                episodes.append(None)
        observations: dict[int, list[Message]] = {}

        async def reset(n: int, episode: CollabEpisode) -> None:
            try:
                observations[n] = await episode.reset()
            except Exception as exc:
                results[n] = exc

        await asyncio.gather(*(reset(n, e) for n, e in enumerate(episodes) if e is not None))
        while live := sorted(observations):
            try:
                texts = await self.agent.replies([(jobs[n][0], observations[n]) for n in live])
            except Exception as exc:  # the agent's model failed for the whole batch
                for n in live:
                    results[n] = exc
                break
            await asyncio.gather(
                *(self._step(n, episodes[n], text, observations, results) for n, text in zip(live, texts, strict=True))
            )
        for n, episode in enumerate(episodes):
            if results[n] is None and episode is not None:
                record = episode.record()
                share = await session_share(record, episode.spec.profile, self.judge)
                results[n] = SessionOutcome(
                    share, len(record["turns"]) // 2, record["user_effort"], record["task_success"]
                )
        return [r if r is not None else RuntimeError("session never finished") for r in results]

    @staticmethod
    async def _step(
        n: int,
        episode: CollabEpisode | None,
        text: str,
        observations: dict[int, list[Message]],
        results: list[SessionOutcome | BaseException | None],
    ) -> None:
        assert episode is not None
        try:
            step = await episode.step(text)
        except Exception as exc:
            results[n] = exc
            del observations[n]
            return
        if step.done:
            del observations[n]
        else:
            observations[n] = step.observation

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"sessions": self.sessions, "cache_hits": self.hits, "failures": self.failures}

    def close(self) -> None:
        for backend in self._backends:
            backend.close()


def mean_score(parts: Sequence[OutcomeParts]) -> float | None:
    scores = [p.score for p in parts if p.score is not None]
    return round(fmean(scores), 4) if scores else None


# --- the model agent and judge of real runs -----------------------------------------------------------------------


class ModelAgent:
    """The collab policy's prompt with the notes in its system prompt (as `CollabAgent` keeps them) over any
    backend; the batch is one `generate` call, off the event loop. `reply`: the policy's reply format, so a policy
    trained with `collab_grpo` (envs/collab/rl.py) reads the notes and replies here as it learned to."""

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
        done = await asyncio.to_thread(self.backend.generate, prompts, self.sampling)
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
        done = await asyncio.to_thread(self.backend.generate, prompts, self.sampling)
        out: list[bool | None] = []
        for completion in done:
            parsed = parse_json_object(completion.text, required=("satisfied",))
            value = None if isinstance(parsed, JSONParseFailure) else parsed.data["satisfied"]
            out.append(not value if isinstance(value, bool) else None)
        return out


def build_scorer(cfg: OutcomeRewardConfig) -> NextSessionScorer:
    """The scorer a recipe's `reward.outcome` describes (Ray actors when `workers` or `ray_address` is set)."""
    from memrl.rollout.builder import build_backend

    if cfg.workers or cfg.ray_address:
        from memrl.envs.collab.outcome_actors import ActorScorer

        return ActorScorer(cfg)
    backends = [build_backend(cfg.agent)]
    judge = None
    if cfg.judge is not None:
        backends.append(build_backend(cfg.judge))
        judge = LLMPreferenceJudge(backends[-1])
    return NextSessionScorer(
        ModelAgent(backends[0], cfg.sampling.params(), name=cfg.agent.model, reply=cfg.reply),
        max_turns=cfg.max_turns,
        seed=cfg.seed,
        problems=cfg.problems,
        judge=judge,
        cache_size=cfg.cache_size,
        backends=backends,
    )
