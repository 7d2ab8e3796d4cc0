"""Memory-writer data from a PAHF shopping run: (feedback context -> memory update), rewarded by the next round.

Every note the agent wrote from a user's answer or correction becomes one record. Its prompt is the note-writing
prompt the writer saw (`prompts.note_messages`), its completion the note it stored, and its reward the rule-based
outcome of the next round that note informed: the first later task of the same user, on the same product, whose
retrieval returned that note (1.0 when that decision was right, else 0.0). A note no later task retrieved has no
reward and is skipped (counted).

Layout under `out_dir` (the reflection dataset's trainer formats, see `data_gen.writers`):
- `train.jsonl`, `eval.jsonl`: full records;
- `sft/{split}.jsonl|parquet`: `{"messages": prompt + note}` for the rewarded notes only (reward 1: rejection
  sampling); TRL SFTTrainer and verl's SFT trainer read these;
- `kto/{split}.jsonl`: `{"prompt", "completion", "label"}`, every record with its binary outcome (TRL KTOTrainer's
  unpaired-preference format);
- `stats.json`: sizes, users, reward rate, skipped writes and why.
Train and eval hold different users.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.files import write_jsonl
from memrl.core.outcomes import Outcome, require_success
from memrl.data_gen.config import PahfDataConfig
from memrl.data_gen.writers import SFT_SCHEMA, write_parquet
from memrl.envs.driver import FailedWork
from memrl.envs.pahf import prompts
from memrl.envs.pahf.records import TASKS_FILE, TaskRecord, read_tasks

SKIP_REASONS = ("not_salient", "never_retrieved")


@dataclass(frozen=True)
class MemoryUpdateRecord:
    key: str  # "{task key}#{write index}"
    user: str
    phase: int
    product: str
    source: str  # answer | feedback
    feedback: str  # what the user said
    prompt: list[dict[str, str]]
    note: str  # what the writer stored (after a merge: the merged note)
    action: str  # add | merge
    next_key: str
    reward: float

    def completion(self) -> str:
        return json.dumps({"note": self.note}, ensure_ascii=False)

    def sft_messages(self) -> list[dict[str, str]]:
        return [*self.prompt, {"role": "assistant", "content": self.completion()}]


def _order(task: TaskRecord) -> tuple[int, int, int]:
    return task.phase, task.pass_, task.index


def build_records(tasks: Iterable[TaskRecord]) -> tuple[list[MemoryUpdateRecord], Counter[str]]:
    """The memory updates of a run's task records (any order), each with the outcome of the round it informed."""
    by_user: dict[str, list[TaskRecord]] = {}
    for task in tasks:
        if task.product is None:
            raise ConfigError(f"task {task.key!r} has no product: memory-writer data needs a shopping run")
        by_user.setdefault(task.user, []).append(task)
    out: list[MemoryUpdateRecord] = []
    skipped: Counter[str] = Counter({k: 0 for k in SKIP_REASONS})
    for user, rows in by_user.items():
        rows.sort(key=_order)
        for i, task in enumerate(rows):
            for w, write in enumerate(task.writes):
                if write.action == "skip":
                    skipped["not_salient"] += 1
                    continue
                informed = next(
                    (
                        later
                        for later in rows[i + 1 :]
                        if later.product == task.product and write.note_id in later.retrieved_ids
                    ),
                    None,
                )
                if informed is None:
                    skipped["never_retrieved"] += 1
                    continue
                question = task.question if write.source == "answer" else None
                prompt = prompts.note_messages(user, task.instruction, write.text, question)
                out.append(
                    MemoryUpdateRecord(
                        key=f"{task.key}#{w}",
                        user=user,
                        phase=task.phase,
                        product=str(task.product),  # every task has one: refused above
                        source=write.source,
                        feedback=write.text,
                        prompt=[{"role": m["role"], "content": m["content"]} for m in prompt],
                        note=write.note,
                        action=write.action,
                        next_key=informed.key,
                        reward=1.0 if informed.correct else 0.0,
                    )
                )
    return out, skipped


def split_users(users: Sequence[str], eval_users: int) -> tuple[set[str], set[str]]:
    """The last `eval_users` users (by name) are held out."""
    if not 0 <= eval_users < len(users):
        raise ConfigError(f"--eval-users {eval_users}: the run has {len(users)} users; at least one must train")
    cut = len(users) - eval_users
    return set(users[:cut]), set(users[cut:])


def _stats(records: Sequence[MemoryUpdateRecord]) -> dict[str, Any]:
    return {
        "records": len(records),
        "users": len({r.user for r in records}),
        "rewarded": sum(r.reward == 1.0 for r in records),
        "reward_rate": round(sum(r.reward for r in records) / len(records), 4) if records else 0.0,
        "by_source": dict(Counter(r.source for r in records)),
    }


def _require_finished_tasks(run_dir: Path, tasks: Sequence[TaskRecord]) -> None:
    """A run whose tasks failed (its `failed.jsonl`) and none finished fails here in one line with the count."""
    failed = FailedWork.outstanding(run_dir, {t.key for t in tasks})
    first = f"task {failed[0].get('key')}: {failed[0].get('error')}" if failed else None
    outcome = Outcome(f"tasks of {run_dir}", len(tasks) + len(failed), len(tasks), len(failed), first)
    require_success("data pahf", outcome, then="no dataset written; rerun the eval to run them again")


def build_pahf_dataset(cfg: PahfDataConfig, out_dir: Path) -> dict[str, Any]:
    """Read `run/tasks.jsonl` (a `memrl eval pahf --domain shopping` run), write the dataset, return its stats."""
    run_dir = cfg.run
    path = run_dir / TASKS_FILE
    tasks = read_tasks(path) if path.is_file() else []
    _require_finished_tasks(run_dir, tasks)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist (run `memrl eval pahf --domain shopping --out {run_dir}` first)")
    if not tasks:
        raise ConfigError(f"{path}: no task records")
    users = sorted({t.user for t in tasks})
    records, skipped = build_records(tasks)
    train_users, _ = split_users(users, cfg.eval_users)
    splits = {
        "train": [r for r in records if r.user in train_users],
        "eval": [r for r in records if r.user not in train_users],
    }
    for split, rows in splits.items():
        write_jsonl((asdict(r) for r in rows), out_dir / f"{split}.jsonl")
        sft = [{"messages": r.sft_messages()} for r in rows if r.reward == 1.0]
        write_jsonl(sft, out_dir / "sft" / f"{split}.jsonl")  # may be empty (no note rewarded): the SFT stage says so
        write_parquet(sft, SFT_SCHEMA, out_dir / "sft" / f"{split}.parquet")
        kto = [{"prompt": r.prompt, "completion": [{"role": "assistant", "content": r.completion()}],
                "label": r.reward == 1.0} for r in rows]  # fmt: skip
        write_jsonl(kto, out_dir / "kto" / f"{split}.jsonl")
    stats = {split: _stats(rows) for split, rows in splits.items()} | {
        "tasks": len(tasks),
        "skipped": dict(skipped),
        "source": str(path),
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
