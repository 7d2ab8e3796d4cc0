"""MS-TOD sessions as rows to play online: the row (a confirming session and what memory gave the reader), its
episode, and how the policy sees it.

A row is the JSON of one confirming session of an individual: the session (its record, `Session.to_record()`), the
answers the memory planner selected from the individual's earlier sessions (A_core) and the slots the reasoner
found unsettled, each as the reader names it. The planning runs once, when the rows are written (schema intent and
reasoner, offline retrieval: no model). The policy plays the reader: it is prompted exactly as `LLMReader` is (the
same instructions with the same memory), its first reply is the confirmation, and its later replies answer the
simulated user's corrections until the supervisor finds every goal slot resolved or the turn limit comes
(`ProactiveEpisode`). So a trained policy is evaluated as the reader: `memrl eval tod --reader MODEL`.

`TodRLConfig` is the online section (the `env` of a `tod_grpo` stage): which sessions, how memory is selected, and
the user and supervisor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, PositiveInt, model_validator

from memrl.core.asyncs import run_sync
from memrl.core.errors import ConfigError
from memrl.envs.episode import PolicyReply
from memrl.envs.online import OnlineConfig, PolicyView
from memrl.envs.tod.config import TodEvalConfig
from memrl.envs.tod.formats import Session
from memrl.envs.tod.prompts import reader_system
from memrl.rollout.base import ChatBackend, Message
from memrl.rollout.config import ModelConfig, SamplingConfig

if TYPE_CHECKING:
    from memrl.envs.tod.proactive import ProactiveEpisode, Supervisor, UserSimulator
    from memrl.envs.tod.runner import Job

# The loop, the planner and the reader load retrieval and the judger's heads: imported where they run, so that the
# registry of worlds (and every CLI command built from it) loads only this module's configs and views.


def read_reply(raw: str) -> PolicyReply:
    """The policy's reply -> the assistant's turn, as `LLMReader` reads its model's."""
    from memrl.envs.tod.reader import read_text

    reply = read_text(raw)
    return reply.text, {"parse_failed": reply.failed}


def _session(row: dict[str, object]) -> Session:
    return Session.model_validate(row["session"])


def policy_view(spec: str, reply_tokens: int) -> PolicyView:
    """How the policy sees a row's session: the reader's instructions with the row's memory and unsettled slots; the
    opening is the session's turns before the confirmation. (The reader's prompt names no reply budget.)"""
    row = json.loads(spec)
    opening: list[Message] = [{"role": t.speaker, "content": t.utterance} for t in _session(row).context()]
    return PolicyView([reader_system(row["memory"], row["missing"])], read_reply, opening)


class TodEpisodes:
    """TOD's `Episodes`: a fresh `ProactiveEpisode` for every rollout of a row, with the world's user and
    supervisor."""

    def __init__(
        self, user: UserSimulator, supervisor: Supervisor, max_turns: int, backends: Sequence[ChatBackend] = ()
    ) -> None:
        self.user = user
        self.supervisor = supervisor
        self.max_turns = max_turns
        self._backends = list(backends)  # what `close` releases: the LLM user's and supervisor's model

    def episode(self, spec: str) -> ProactiveEpisode:
        from memrl.envs.tod.proactive import ProactiveEpisode

        session = _session(json.loads(spec))
        assert session.confirmation_state is not None  # rows hold confirming sessions only
        goal = dict(session.confirmation_state.slot_values)
        return ProactiveEpisode(session.context(), goal, self.user, self.supervisor, self.max_turns)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()


class TodRLConfig(OnlineConfig):
    """The confirming sessions a policy trains on, with the memory of each individual's earlier sessions."""

    refs: ClassVar[tuple[str, ...]] = ("data",)

    data: Path = Field(description="MS-TOD folder (persona_*.json, schema.json), or the tod_data stage that wrote it")
    individuals: PositiveInt | None = Field(default=None, description="the first N individuals; None: all")
    sessions: PositiveInt | None = Field(default=None, description="the first N confirming sessions; None: all")
    retriever: Literal["dense", "bm25", "hybrid"] = Field(
        default="bm25", description="bm25 (offline) | dense (MiniLM) | hybrid retrieval over the memory QA pairs"
    )
    top_k: PositiveInt = Field(default=5, description="remembered answers the policy gets")
    top_units: PositiveInt | None = Field(default=3, description="memory units kept by intent alignment; None: all")
    max_turns: PositiveInt = Field(default=4, description="policy replies per episode (the confirmation included)")
    user: Literal["rule", "llm"] = Field(default="rule", description="user simulator: rule | llm")
    supervisor: Literal["rule", "llm"] = Field(default="rule", description="supervisor: rule | llm")
    user_model: ModelConfig | None = Field(default=None, description="the llm user's and supervisor's model")
    user_sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=64)
    seed: int = Field(default=0, description="seed of the llm user's and supervisor's sampling")
    workers: PositiveInt | None = Field(
        default=None, description="step the episodes' users on this many Ray actors; null: in-process"
    )
    ray_address: str | None = Field(default=None, description="Ray cluster of the actors; default: a local Ray")

    @model_validator(mode="after")
    def _user_model_for_llm(self) -> TodRLConfig:
        if "llm" in (self.user, self.supervisor) and self.user_model is None:
            raise ValueError("an llm user or supervisor needs a user_model")
        return self

    def eval_config(self) -> TodEvalConfig:
        """The evaluation config of the same sessions, memory selection and loop (its reader is the policy)."""
        return TodEvalConfig(
            data=self.data,
            retriever=self.retriever,
            top_k=self.top_k,
            top_units=self.top_units,
            reader="template",
            user=self.user,
            supervisor=self.supervisor,
            llm=self.user_model,
            max_turns=self.max_turns,
            individuals=self.individuals,
            sessions=self.sessions,
            seed=self.seed,
        )

    def rows(self) -> list[str]:
        """One JSON spec per confirming session, in the order `eval tod` plays them."""
        from memrl.envs.tod.reader import missing_names
        from memrl.envs.tod.runner import build_planner, plan_jobs, prepare

        if not (self.data / "schema.json").is_file():
            raise ConfigError(f"env.data {self.data}: no schema.json (an MS-TOD folder, as `memrl data tod` writes)")
        cfg = self.eval_config()
        plan = plan_jobs(cfg)
        if not plan.jobs:
            raise ConfigError(f"env.data {self.data}: the chosen individuals have no confirming session to play")
        planner = build_planner(cfg, plan.schemas, None)  # schema intent and reasoner: no model

        async def row(job: Job) -> str:
            ready = await prepare(planner, plan.schemas, job)
            memory, missing = ready.plan.selection.a_core, missing_names(ready.request)
            return json.dumps({"key": job.key, "session": job.session, "memory": memory, "missing": missing})

        async def every() -> list[str]:
            return [await row(job) for job in plan.jobs]

        return run_sync(every())

    def episodes(self) -> TodEpisodes:
        from memrl.envs.tod.proactive import SUPERVISORS, USERS
        from memrl.envs.tod.runner import seeded
        from memrl.rollout.builder import build_backend

        played = self.user_model is not None and "llm" in (self.user, self.supervisor)
        backends = [build_backend(self.user_model)] if played and self.user_model is not None else []
        llm = backends[0] if backends else None
        sampling = seeded(self.user_sampling, self.seed)
        user, supervisor = USERS[self.user](llm, sampling), SUPERVISORS[self.supervisor](llm, sampling)
        return TodEpisodes(user, supervisor, self.max_turns, backends)

    def plays(self) -> str:
        return (
            f"with a {self.user} user and a {self.supervisor} supervisor on the confirming sessions of {self.data} (up "
            f"to {self.max_turns} replies)"
        )
