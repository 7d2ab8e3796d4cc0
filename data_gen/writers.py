"""One reflection training sample (`ReflectionRecord`: the reflector's input, notes before + session, what it should
learn, its gold), the trainers' formats of the reflection dataset, one small writer each, and `write_dataset` for
the whole folder.

Layout under `out_dir`:
- `train.jsonl`, `eval.jsonl`: full records.
- `sft/{split}.jsonl` and `.parquet`: `{"messages": prompt + gold}` (TRL SFTTrainer; verl MultiTurnSFTDataset).
- `rl/{split}.jsonl`: `{"prompt", "ground_truth" (JSON text), "key"}` (TRL GRPOTrainer).
- `rl/{split}.parquet`: `data_source, prompt, ability, reward_model, extra_info` (verl RLHFDataset).
- `llamafactory/`: `dataset_info.json` + `memrl_reflection_{train,eval}.json` (OpenAI-style messages).
- `stats.json`: counts, enforced-preference histogram, skipped sessions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from memrl.core.files import write_jsonl
from memrl.rewards.types import GroundTruth
from memrl.rollout.base import Message

if TYPE_CHECKING:
    from memrl.data_gen.reflection import Skipped

DATA_SOURCE = "memrl/collab_reflection"
ABILITY = "reflection"


@dataclass(frozen=True)
class ReflectionRecord:
    key: str  # "{user_id}/s{session}"
    user_id: str
    problem_id: str
    session: int
    task: str
    preferences: tuple[str, ...]  # the user's true preference ids
    enforced: tuple[str, ...]  # ids the user enforced in this session (rule simulator labels)
    expected: tuple[str, ...]  # ids the updated notes should hold: enforced now + carried from earlier sessions
    enforcements: tuple[str, ...]  # epsilon: the user's enforcing utterances in this session
    notes_before: str
    conversation: tuple[Message, ...]
    prompt: tuple[Message, ...]  # reflection_messages(notes_before, conversation)
    gold_reasoning: str
    gold_notes: str
    gold: str  # the assistant target: JSON text of REFLECTION_KEYS

    def ground_truth(self) -> dict[str, Any]:
        """What the reward reads: GroundTruth.to_dict()."""
        return GroundTruth(self.enforcements, self.gold_notes, self.expected).to_dict()

    def prompt_messages(self) -> list[dict[str, str]]:
        return [{"role": m["role"], "content": m["content"]} for m in self.prompt]

    def sft_messages(self) -> list[dict[str, str]]:
        return [*self.prompt_messages(), {"role": "assistant", "content": self.gold}]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("preferences", "enforced", "expected", "enforcements", "conversation", "prompt"):
            data[name] = [dict(m) if isinstance(m, dict) else m for m in data[name]]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReflectionRecord:
        """Read back a line of train.jsonl / eval.jsonl."""

        def messages(name: str) -> tuple[Message, ...]:
            return tuple(Message(role=m["role"], content=m["content"]) for m in data[name])

        return cls(
            key=str(data["key"]),
            user_id=str(data["user_id"]),
            problem_id=str(data["problem_id"]),
            session=int(data["session"]),
            task=str(data["task"]),
            preferences=tuple(data["preferences"]),
            enforced=tuple(data["enforced"]),
            expected=tuple(data["expected"]),
            enforcements=tuple(data["enforcements"]),
            notes_before=str(data["notes_before"]),
            conversation=messages("conversation"),
            prompt=messages("prompt"),
            gold_reasoning=str(data["gold_reasoning"]),
            gold_notes=str(data["gold_notes"]),
            gold=str(data["gold"]),
        )


LLAMAFACTORY_NAMES = {"train": "memrl_reflection_train", "eval": "memrl_reflection_eval"}

# Explicit schemas: arrow must not guess types from the data (an all-empty list column would become list<null>).
_MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
_STRINGS = pa.list_(pa.string())
SFT_SCHEMA = pa.schema([("messages", _MESSAGES)])
VERL_RL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", _MESSAGES),
        ("ability", pa.string()),
        (
            "reward_model",
            pa.struct(
                [
                    ("style", pa.string()),
                    (
                        "ground_truth",
                        pa.struct([("enforcements", _STRINGS), ("gold_notes", pa.string()), ("expected", _STRINGS)]),
                    ),
                ]
            ),
        ),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("key", pa.string()),
                    ("user_id", pa.string()),
                    ("problem_id", pa.string()),
                    ("session", pa.int64()),
                ]
            ),
        ),
    ]
)


def write_parquet(rows: Sequence[dict[str, Any]], schema: pa.Schema, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), path)
    return path


def write_records(records: Sequence[ReflectionRecord], path: Path) -> Path:
    return write_jsonl((r.to_dict() for r in records), path)


def sft_rows(records: Sequence[ReflectionRecord]) -> list[dict[str, Any]]:
    return [{"messages": r.sft_messages()} for r in records]


def write_sft(records: Sequence[ReflectionRecord], directory: Path, split: str) -> list[Path]:
    """Messages JSONL (TRL) and parquet (verl's MultiTurnSFTDataset reads parquet, key `messages`)."""
    rows = sft_rows(records)
    return [
        write_jsonl(rows, directory / f"{split}.jsonl"),
        write_parquet(rows, SFT_SCHEMA, directory / f"{split}.parquet"),
    ]


def write_trl_rl(records: Sequence[ReflectionRecord], path: Path) -> Path:
    """TRL GRPO: extra columns reach the reward functions as keyword arguments; ground_truth stays a JSON string."""
    rows = (
        {"prompt": r.prompt_messages(), "ground_truth": json.dumps(r.ground_truth()), "key": r.key} for r in records
    )
    return write_jsonl(rows, path)


def verl_rl_rows(records: Sequence[ReflectionRecord], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": r.prompt_messages(),
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": r.ground_truth()},
            "extra_info": {
                "split": split,
                "index": index,
                "key": r.key,
                "user_id": r.user_id,
                "problem_id": r.problem_id,
                "session": r.session,
            },
        }
        for index, r in enumerate(records)
    ]


def write_verl_rl(records: Sequence[ReflectionRecord], path: Path, split: str) -> Path:
    return write_parquet(verl_rl_rows(records, split), VERL_RL_SCHEMA, path)


def llamafactory_entry(file_name: str) -> dict[str, Any]:
    """A dataset_info.json entry for OpenAI-style messages (LLaMA-Factory's sharegpt formatting with role tags)."""
    return {
        "file_name": file_name,
        "formatting": "sharegpt",
        "columns": {"messages": "messages"},
        "tags": {
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "system_tag": "system",
        },
    }


def write_llamafactory(splits: dict[str, Sequence[ReflectionRecord]], directory: Path) -> Path:
    """One JSON file per split plus the dataset_info.json that names them; pass `dataset_dir: <directory>`."""
    directory.mkdir(parents=True, exist_ok=True)
    info = {}
    for split, records in splits.items():
        name = LLAMAFACTORY_NAMES[split]
        (directory / f"{name}.json").write_text(json.dumps(sft_rows(records), ensure_ascii=False, indent=1) + "\n")
        info[name] = llamafactory_entry(f"{name}.json")
    path = directory / "dataset_info.json"
    path.write_text(json.dumps(info, indent=2) + "\n")
    return path


# --- stats --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitStats:
    records: int
    users: int
    problems: int
    with_enforcement: int  # records whose session enforced at least one preference
    enforced: dict[str, int]  # preference id -> records that enforced it, most frequent first
    skipped: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, records: Sequence[ReflectionRecord], skipped: dict[str, int] | None = None) -> SplitStats:
        counts = Counter(pid for r in records for pid in r.enforced)
        return cls(
            records=len(records),
            users=len({r.user_id for r in records}),
            problems=len({r.problem_id for r in records}),
            with_enforcement=sum(bool(r.enforcements) for r in records),
            enforced=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
            skipped=skipped or {},
        )


@dataclass(frozen=True)
class Stats:
    train: SplitStats
    eval: SplitStats
    data_source: str = DATA_SOURCE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_dataset(
    train: Sequence[ReflectionRecord],
    eval_: Sequence[ReflectionRecord],
    out_dir: str | Path,
    skipped: Skipped | None = None,
) -> Stats:
    """Every format of both splits under `out_dir` (layout in the module docstring); returns the stats written."""
    out = Path(out_dir)
    splits = {"train": train, "eval": eval_}
    for split, records in splits.items():
        write_records(records, out / f"{split}.jsonl")
        write_sft(records, out / "sft", split)
        write_trl_rl(records, out / "rl" / f"{split}.jsonl")
        write_verl_rl(records, out / "rl" / f"{split}.parquet", split)
    write_llamafactory(splits, out / "llamafactory")
    skips = skipped.to_dict() if skipped is not None else {}
    stats = Stats(SplitStats.of(train, skips.get("train")), SplitStats.of(eval_, skips.get("eval")))
    (out / "stats.json").write_text(json.dumps(stats.to_dict(), indent=2) + "\n")
    return stats
