"""The PAHF agent: retrieve -> summarise -> decide (or ask once) -> act -> learn from feedback.

Kinds (the paper's four settings) differ only in which feedback channels they use; see `ABILITIES`. Every model
call goes through a `ChatBackend`; an unusable reply is counted in `failures` and never stops a run.

`PahfEpisode` is one task as an `Episode` (memrl.envs.episode): the environment is the task and its user, the
policy the agent's decision step. `PahfAgent.run` is the agent playing it, with its memory around the decisions.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol

from memrl.envs.episode import Step, check_step
from memrl.envs.pahf import prompts
from memrl.envs.pahf.memory import MemoryStore
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, field_text, parse_json_object

Domain = Literal["shopping", "embodied"]
FAILURE_KINDS = ("decision", "summary", "salience", "note", "merge")
RAW_KEPT = 300  # characters of an unusable decision reply kept in the task record


class AgentKind(StrEnum):
    NONE = "none"
    PRE = "pre"
    POST = "post"
    PAHF = "pahf"


@dataclass(frozen=True)
class Abilities:
    memory: bool  # reads and writes a per-user note store
    asks: bool  # may ask one clarification question per task (learning phases only)
    learns_from_answers: bool
    learns_from_feedback: bool  # post-action corrections


ABILITIES: dict[AgentKind, Abilities] = {
    AgentKind.NONE: Abilities(memory=False, asks=False, learns_from_answers=False, learns_from_feedback=False),
    AgentKind.PRE: Abilities(memory=True, asks=True, learns_from_answers=True, learns_from_feedback=False),
    AgentKind.POST: Abilities(memory=True, asks=False, learns_from_answers=False, learns_from_feedback=True),
    AgentKind.PAHF: Abilities(memory=True, asks=True, learns_from_answers=True, learns_from_feedback=True),
}


@dataclass(frozen=True)
class Task:
    """One decision: what the agent sees, and the gold option it is scored against."""

    domain: Domain
    user: str
    instruction: str
    options: dict[str, str]  # letter -> what the option does, in order (A, B, C, D)
    gold: str
    scene: str = ""


class TaskUser(Protocol):
    """The simulated user of one task: answers the agent's question and reacts to its action."""

    async def answer(self, question: str) -> str: ...

    async def feedback(self, choice: str) -> str | None:
        """Post-action feedback on a wrong `choice`; None when the user has nothing to say."""
        ...


@dataclass(frozen=True)
class AgentSampling:
    """Sampling per model call of the agent (`PahfSampling.agent()` builds the defaults)."""

    decision: SamplingParams
    summary: SamplingParams
    salience: SamplingParams
    note: SamplingParams
    merge: SamplingParams


@dataclass(frozen=True)
class Decision:
    action: str | None  # an option letter, prompts.ASK, or None when the reply was unusable
    thought: str = ""
    question: str = ""
    raw: str = ""


_ASK_LINE = re.compile(r"^\W*ask\s*[:\-]\s*(?P<question>\S.*)", re.IGNORECASE)
# A letter alone, or followed by ")", ":", "." or " is": "A user ..." is an article, not option A.
_LEADING_LETTER = re.compile(r"^\W*(?:option\s+)?(?P<letter>[A-Za-z])(?=\s*$|\s*[).:,\]-]|\s+is\b)", re.IGNORECASE)
_ANSWER_IS = re.compile(r"\b(?:answer|choice|option I choose) is:?\s*(?:option\s+)?\(?(?P<letter>[A-Z])\b")


def parse_decision(raw: str, letters: str, may_ask: bool) -> Decision:
    """The action of a decision reply; None when it names no option, or asks when asking is not allowed.

    Read in order: a JSON object with "action" (large models often answer so), `ASK: question` on the first line,
    a leading option letter ("B", "B) ...", "Option B: ..."), then "the answer is B" anywhere.
    """
    text = raw.strip()
    first, _, rest = text.partition("\n")
    parsed = parse_json_object(text, required=("action",))
    if not isinstance(parsed, JSONParseFailure):
        action = field_text(parsed.data.get("action")).strip().strip(".()").strip()
        thought, question = field_text(parsed.data.get("thought")).strip(), field_text(parsed.data.get("question"))
        if action.lower() == prompts.ASK:
            first = f"ASK: {question.strip()}"
        else:
            first, rest = action, thought
    if (asked := _ASK_LINE.match(first)) is not None:
        question = asked["question"].strip().strip("`").strip()
        return Decision(prompts.ASK, "", question, raw) if may_ask and question else Decision(None, raw=raw)
    found = _LEADING_LETTER.match(first) or _ANSWER_IS.search(text)
    if found is not None and found["letter"].upper() in letters:
        return Decision(found["letter"].upper(), rest.strip() or first.strip(), "", raw)
    return Decision(None, raw=raw)


def parse_salient(raw: str) -> bool | None:
    """yes/no of a salience reply (a bare word, or JSON with "salient"); None when unusable."""
    parsed = parse_json_object(raw, required=("salient",))
    if not isinstance(parsed, JSONParseFailure):
        value = parsed.data["salient"]
        if isinstance(value, bool):
            return value
        raw = field_text(value)
    word = raw.strip().strip("\"'`*.").lower()
    if word.startswith("yes") or word == "true":
        return True
    if word.startswith("no") or word == "false":
        return False
    return None


def _note(raw: str) -> str | None:
    parsed = parse_json_object(raw, required=prompts.NOTE_KEYS)
    if isinstance(parsed, JSONParseFailure):
        return None
    return field_text(parsed.data["note"]).strip() or None


class PahfEpisode:
    """One task as an `Episode`: the task speaks first, each step is one decision reply of the policy.

    `reset` returns the task (user, instruction, what the agent sees, the options) as one user message. `step(reply)`
    reads the reply with `parse_decision` (asking is allowed on the first decision only, and only when `may_ask` and
    `learning`). A question is answered by the user: the answer closes the next observation, the episode goes on,
    `info` has `question` and `answer`. Anything else acts and ends the episode: the reward part `correct` (0/1) on
    that step only (an unusable reply takes no action and is not correct). In a learning phase a wrong action gets the
    user's feedback when `wants_feedback` (the agent listens): it closes the final observation when the user has
    something to say. The final `info` has `choice`, `thought`, `correct`, `feedback` and `unusable` (the start of a
    reply that named no action, else None). Acting terminates the episode; nothing truncates it (one question at
    most, then an action). The record is the task's side: the exchange and the action. The task draws nothing at
    `reset`: its option order and its user's sampling seed are fixed when the task and user are built
    (`protocol.build_task`), so every seed (None too) plays alike.
    """

    def __init__(
        self, task: Task, user: TaskUser, learning: bool, *, may_ask: bool = True, wants_feedback: bool = True
    ) -> None:
        self.task = task
        self.learning = learning
        self.may_ask = may_ask and learning
        self.wants_feedback = wants_feedback and learning
        self._user = user
        self._turns: list[Message] | None = None  # None until reset
        self._asked: tuple[str, str] | None = None  # (question, answer)
        self._record: dict[str, Any] | None = None  # set by the last step

    async def reset(self, *, seed: int | None = None) -> list[Message]:
        """Start the task afresh and return it (`seed` changes nothing: see the class)."""
        task = self.task
        scene = f"\nWhat you see: {task.scene}" if task.scene else ""
        options = "\n".join(f"{letter}) {text}" for letter, text in task.options.items())
        self._turns = [{"role": "user", "content": f"{task.user}: {task.instruction}{scene}\nOptions:\n{options}"}]
        self._asked, self._record = None, None
        return list(self._turns)

    async def step(self, reply: str, **unknown: Any) -> Step:
        turns = check_step(self, unknown, self._turns, over=self._record is not None)
        turns.append({"role": "assistant", "content": reply})
        decision = parse_decision(reply, "".join(self.task.options), self.may_ask and self._asked is None)
        if decision.action == prompts.ASK:
            answer = await self._user.answer(decision.question)
            self._asked = (decision.question, answer)
            turns.append({"role": "user", "content": answer})
            return Step(list(turns), info={"question": decision.question, "answer": answer})
        correct = decision.action == self.task.gold
        feedback: str | None = None
        if self.wants_feedback and decision.action is not None and not correct:
            feedback = await self._user.feedback(decision.action)
            if feedback:
                turns.append({"role": "user", "content": feedback})
        asked: tuple[str | None, str | None] = self._asked or (None, None)
        info: dict[str, Any] = {
            "choice": decision.action,
            "thought": decision.thought,
            "correct": correct,
            "feedback": feedback,
            "unusable": decision.raw[:RAW_KEPT] if decision.action is None else None,
        }
        self._record = {"user": self.task.user, "gold": self.task.gold, "question": asked[0], "answer": asked[1]} | info
        return Step(list(turns), {"correct": float(correct)}, terminated=True, info=dict(info))

    def record(self) -> dict[str, Any]:
        """The task's side of the task record: the question asked and answered, the action, the feedback."""
        if self._record is None:
            raise RuntimeError("the episode has no record before its last step")
        return self._record


@dataclass
class Write:
    """What one piece of feedback did to memory."""

    source: Literal["answer", "feedback"]
    text: str
    salient: bool
    note: str = ""
    action: Literal["skip", "add", "merge"] = "skip"
    note_id: int | None = None
    similarity: float | None = None

    def to_record(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class MemoryWriter:
    """Salience check -> one-note summary -> integrate (merge into the nearest note above `tau`, else add).

    The pluggable memory-writing step: a trained reflector can stand behind `backend`.
    """

    backend: ChatBackend
    sampling: AgentSampling
    tau: float = 0.8

    async def write(
        self,
        store: MemoryStore,
        task: Task,
        source: Literal["answer", "feedback"],
        text: str,
        failures: Counter[str],
        question: str | None = None,
    ) -> Write:
        raw = (await self.backend.achat(prompts.salience_messages(text), self.sampling.salience)).text
        salient = parse_salient(raw)
        if salient is None:
            failures["salience"] += 1  # counted; stored anyway: a lost correction costs more than a stored "thanks"
        elif not salient:
            return Write(source, text, False)
        raw = (
            await self.backend.achat(
                prompts.note_messages(task.user, task.instruction, text, question), self.sampling.note
            )
        ).text
        note = _note(raw)
        if note is None:
            failures["note"] += 1
            note = f"{task.user}: {text}"  # the feedback itself still carries the preference
        write = await self.integrate(store, task.user, note, failures)
        write.source, write.text = source, text
        return write

    async def integrate(self, store: MemoryStore, user: str, note: str, failures: Counter[str]) -> Write:
        """Merge `note` into the user's most similar note when the cosine reaches `tau`; else add it."""
        hit = store.most_similar(user, note, self.tau)
        if hit is None:
            return Write("feedback", note, True, note, "add", store.add(user, note))
        old, score = hit
        raw = (await self.backend.achat(prompts.merge_messages(old.text, note), self.sampling.merge)).text
        merged = _note(raw)
        if merged is None:
            failures["merge"] += 1
            merged = note  # newer information wins over a stale note
        store.update(user, old.id, merged)
        return Write("feedback", note, True, merged, "merge", old.id, round(float(score), 4))


@dataclass
class Outcome:
    """How one task went (`records.TaskRecord.of` records it)."""

    choice: str | None
    correct: bool
    thought: str = ""
    question: str | None = None
    answer: str | None = None
    feedback: str | None = None
    retrieved: list[dict[str, Any]] = field(default_factory=list)
    summary: str = ""
    writes: list[Write] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    unusable: str | None = None  # the start of a decision reply that named no action

    @property
    def used_feedback(self) -> bool:
        return self.answer is not None or self.feedback is not None


@dataclass(frozen=True)
class PahfAgent:
    kind: AgentKind
    backend: ChatBackend
    writer: MemoryWriter
    sampling: AgentSampling
    top_k: int = 5

    @property
    def abilities(self) -> Abilities:
        return ABILITIES[self.kind]

    async def _summarise(self, store: MemoryStore | None, task: Task, outcome: Outcome) -> str:
        if store is None:
            return ""
        query = "\n".join([task.instruction, task.scene, *task.options.values()]).strip()
        hits = store.search(task.user, query, self.top_k)
        outcome.retrieved = [{"id": n.id, "text": n.text, "score": round(float(s), 4)} for n, s in hits]
        if not hits:
            return ""
        notes = [n.text for n, _ in hits]
        raw = (
            await self.backend.achat(
                prompts.summary_messages(task.instruction, task.options, notes), self.sampling.summary
            )
        ).text
        parsed = parse_json_object(raw, required=prompts.SUMMARY_KEYS)
        if isinstance(parsed, JSONParseFailure):
            outcome.failures["summary"] += 1
            return "\n".join(f"- {n}" for n in notes)  # the notes as they are beat no notes
        summary = field_text(parsed.data["summary"]).strip()
        return "" if summary.lower().strip(".") in ("none", "") else summary

    async def _decide(self, task: Task, summary: str, may_ask: bool, clarification: tuple[str, str] | None) -> str:
        """The decision reply, raw: the episode reads it."""
        messages = prompts.decision_messages(
            task.domain,
            task.user,
            task.instruction,
            task.options,
            summary,
            scene=task.scene,
            may_ask=may_ask,
            clarification=clarification,
        )
        return (await self.backend.achat(messages, self.sampling.decision)).text

    async def run(self, task: Task, user: TaskUser, store: MemoryStore | None, learning: bool) -> Outcome:
        """One task. `learning`: a learning phase (questions and feedback allowed); test phases get neither."""
        can = self.abilities
        store = store if can.memory else None
        outcome = Outcome(None, False)
        outcome.summary = await self._summarise(store, task, outcome)
        episode = PahfEpisode(task, user, learning, may_ask=can.asks, wants_feedback=can.learns_from_feedback)
        await episode.reset()
        step = await episode.step(await self._decide(task, outcome.summary, episode.may_ask, None))
        if not step.done:  # asked: the second decision knows the answer and may not ask again
            outcome.question, outcome.answer = step.info["question"], step.info["answer"]
            if store is not None and can.learns_from_answers:  # written before acting, as the paper does
                outcome.writes.append(
                    await self.writer.write(store, task, "answer", outcome.answer, outcome.failures, outcome.question)
                )
            clarification = (step.info["question"], step.info["answer"])
            step = await episode.step(await self._decide(task, outcome.summary, False, clarification))
        acted = step.info
        if acted["unusable"] is not None:
            outcome.failures["decision"] += 1  # no action taken: the task fails
            outcome.unusable = acted["unusable"]
        outcome.choice, outcome.thought, outcome.correct = acted["choice"], acted["thought"], acted["correct"]
        outcome.feedback = acted["feedback"]
        if outcome.feedback and store is not None:
            outcome.writes.append(await self.writer.write(store, task, "feedback", outcome.feedback, outcome.failures))
        return outcome
