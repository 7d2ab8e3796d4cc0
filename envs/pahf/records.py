"""The PAHF task record: one line of `tasks.jsonl` (`memrl eval pahf`), typed, with its writer and its readers.

`UserRunner.run` builds it (`TaskRecord.of`), the driver appends `to_dict()` (the JSON keys, in the order, runs have
always written). The run reads its rows back with `read_task` (a user's notes carry over from their last recorded
task), `memrl data pahf` reads the file with `read_tasks`; both refuse a bad row in one line naming the file, the
row and the key. `product` (shopping only, written since memory-writer data) and `unusable_decision` are written
only when they hold something.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.files import numbered_jsonl
from memrl.core.rows import RowReader
from memrl.envs.pahf.agent import FAILURE_KINDS, Outcome, Task, Write
from memrl.envs.pahf.protocol import Job

TASKS_FILE = "tasks.jsonl"


@dataclass(frozen=True)
class TaskRecord:
    key: str  # phase/user/index/pass
    phase: int
    user: str
    index: int  # the scenario's position among the user's scenarios of the phase
    pass_: int  # "pass" in the file
    instruction: str
    options: dict[str, str]  # letter -> what the option does
    gold: str
    product: str | None  # shopping: the product the task buys; None for embodied tasks
    choice: str | None  # the letter acted on; None when no reply named one
    correct: bool
    thought: str
    question: str | None
    answer: str | None
    feedback: str | None
    used_feedback: bool  # an answer or feedback reached the agent
    retrieved: tuple[dict[str, Any], ...]  # the notes retrieved: {"id", "text", "score"}
    summary: str
    writes: tuple[Write, ...]  # what each answer or feedback did to memory
    failures: dict[str, int]  # per kind of unusable model reply
    unusable_decision: str | None  # the start of a decision reply that named no action
    notes: tuple[str, ...]  # the user's notes after the task

    @classmethod
    def of(cls, job: Job, task: Task, outcome: Outcome, notes: list[str]) -> TaskRecord:
        """The record of `job`, played as `task`, that ended in `outcome` and left the user's `notes`."""
        return cls(
            key=job.key,
            phase=job.phase,
            user=job.user,
            index=job.index,
            pass_=job.pass_,
            instruction=task.instruction,
            options=task.options,
            gold=task.gold,
            product=job.scenario["product"] if task.domain == "shopping" else None,
            choice=outcome.choice,
            correct=outcome.correct,
            thought=outcome.thought,
            question=outcome.question,
            answer=outcome.answer,
            feedback=outcome.feedback,
            used_feedback=outcome.used_feedback,
            retrieved=tuple(outcome.retrieved),
            summary=outcome.summary,
            writes=tuple(outcome.writes),
            failures={k: outcome.failures.get(k, 0) for k in FAILURE_KINDS},
            unusable_decision=outcome.unusable,
            notes=tuple(notes),
        )

    @property
    def retrieved_ids(self) -> set[int]:
        return {hit["id"] for hit in self.retrieved}

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "phase": self.phase,
            "user": self.user,
            "index": self.index,
            "pass": self.pass_,
            "instruction": self.instruction,
            "options": self.options,
            "gold": self.gold,
            **({"product": self.product} if self.product is not None else {}),
            "choice": self.choice,
            "correct": self.correct,
            "thought": self.thought,
            "question": self.question,
            "answer": self.answer,
            "feedback": self.feedback,
            "used_feedback": self.used_feedback,
            "retrieved": list(self.retrieved),
            "summary": self.summary,
            "writes": [w.to_record() for w in self.writes],
            "failures": self.failures,
            **({"unusable_decision": self.unusable_decision} if self.unusable_decision is not None else {}),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, row: Mapping[str, Any], where: str) -> TaskRecord:
        """A record from its JSON object; a missing key or a value of the wrong kind raises ConfigError `WHERE: ...`
        naming the key (`where`: `PATH:LINE`, or which task of a run)."""
        read = RowReader(row, where, "PAHF task record")
        read.require(REQUIRED)
        return cls(
            key=read.text("key"),
            phase=read.integer("phase"),
            user=read.text("user"),
            index=read.integer("index"),
            pass_=read.integer("pass"),
            instruction=read.text("instruction"),
            options=read.texts_by("options"),
            gold=read.text("gold"),
            product=read.optional_text("product"),
            choice=read.optional_text("choice"),
            correct=read.flag("correct"),
            thought=read.text("thought"),
            question=read.optional_text("question"),
            answer=read.optional_text("answer"),
            feedback=read.optional_text("feedback"),
            used_feedback=read.flag("used_feedback"),
            retrieved=read.objects("retrieved", ("text",)),
            summary=read.text("summary"),
            writes=tuple(_write(w, f"{where}: write {n}") for n, w in enumerate(read.objects("writes"))),
            failures=read.counts("failures"),
            unusable_decision=read.optional_text("unusable_decision"),
            notes=read.texts("notes"),
        )


REQUIRED = (
    *("key", "phase", "user", "index", "pass", "instruction", "options", "gold", "choice", "correct", "thought"),
    *("question", "answer", "feedback", "used_feedback", "retrieved", "summary", "writes", "failures", "notes"),
)


def _write(row: Mapping[str, Any], where: str) -> Write:
    read = RowReader(row, where, "note write")
    read.require(("source", "text", "salient", "note", "action"))
    return Write(
        source=read.one_of("source", ("answer", "feedback")),
        text=read.text("text"),
        salient=read.flag("salient"),
        note=read.text("note"),
        action=read.one_of("action", ("skip", "add", "merge")),
        note_id=read.optional_integer("note_id"),
        similarity=read.optional_number("similarity"),
    )


def read_task(row: Mapping[str, Any], out: Path) -> TaskRecord:
    """A row of the run in `out` (as the driver hands it on), named by its key in any complaint."""
    return TaskRecord.from_dict(row, f"{out / TASKS_FILE}: task {row.get('key')!r}")


def read_tasks(path: Path) -> list[TaskRecord]:
    """The records of a run's `tasks.jsonl`, read only: a torn last line (a killed run) stays on disk and is left
    out, any other malformed row is a ConfigError naming `PATH:LINE`."""
    return [TaskRecord.from_dict(row, f"{path}:{n}") for n, row in numbered_jsonl(path, ConfigError)]
