"""Memory-writer data from PAHF task records: each note's reward is the next decision it informed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import MemrlCLI, pahf_task

from memrl.core.errors import ConfigError
from memrl.data_gen.config import PahfDataConfig
from memrl.data_gen.pahf import build_pahf_dataset, build_records
from memrl.envs.pahf import prompts
from memrl.envs.pahf.records import TaskRecord


def _task(user: str, phase: int, index: int, product: str, correct: bool, **kw: Any) -> TaskRecord:
    return pahf_task(
        key=f"{phase}/{user}/{index}/0", phase=phase, user=user, index=index, product=product,
        instruction=f"Pick a {product} for me", correct=correct, **kw,
    )  # fmt: skip


def _write(note_id: int, text: str, note: str, source: str = "feedback", action: str = "add") -> dict[str, Any]:
    return {"source": source, "text": text, "salient": True, "note": note, "action": action, "note_id": note_id}


def _run() -> list[TaskRecord]:
    lamp = "Mira dislikes halogen bulbs in desk lamps"
    return [
        # Mira: a correction on a lamp; a kettle task retrieves the note (other product: not the round it informs),
        # the next lamp task retrieves it and is right -> reward 1.
        _task("Mira", 1, 0, "desk lamp", False, writes=[_write(1, "I don't like the halogen bulb.", lamp)]),
        _task("Mira", 1, 1, "kettle", False, retrieved=[{"id": 1, "text": lamp, "score": 0.3}],
              writes=[{"source": "feedback", "text": "ok", "salient": False, "note": "", "action": "skip"}]),
        _task("Mira", 2, 0, "desk lamp", True, retrieved=[{"id": 1, "text": lamp, "score": 0.9}]),
        # Tomas: an answer before acting, merged into note 7; the next lamp round is wrong -> reward 0. A second
        # note is never retrieved again -> skipped.
        _task("Tomas", 1, 0, "desk lamp", True, question="Which arm do you like?",
              writes=[_write(7, "A gooseneck arm.", "Tomas likes gooseneck arms", "answer", "merge")]),
        _task("Tomas", 3, 0, "desk lamp", False, retrieved=[{"id": 7, "text": "...", "score": 0.8}],
              writes=[_write(8, "My preferences have changed.", "Tomas now wants a clamp mount")]),
    ]  # fmt: skip


def test_rewards_come_from_the_round_each_note_informed() -> None:
    records, skipped = build_records(list(reversed(_run())))  # file order is not plan order
    by_user = {r.user: r for r in records}
    assert len(records) == 2 and skipped == {"not_salient": 1, "never_retrieved": 1}
    mira, tomas = by_user["Mira"], by_user["Tomas"]
    assert (mira.next_key, mira.reward) == ("2/Mira/0/0", 1.0)
    assert (tomas.next_key, tomas.reward, tomas.action) == ("3/Tomas/0/0", 0.0, "merge")
    # The prompt is exactly what the writer saw: the answer prompt carries the agent's question.
    asked = prompts.note_messages("Tomas", "Pick a desk lamp for me", "A gooseneck arm.", "Which arm do you like?")
    told = prompts.note_messages("Mira", "Pick a desk lamp for me", "I don't like the halogen bulb.")
    assert tomas.prompt == [dict(m) for m in asked] and mira.prompt == [dict(m) for m in told]
    assert json.loads(mira.sft_messages()[-1]["content"]) == {"note": "Mira dislikes halogen bulbs in desk lamps"}


def test_dataset_files_and_cli(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "tasks.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in _run()))
    out = tmp_path / "data"
    result = memrl_cli("data", "pahf", "--run", run, "--out", out, "--eval-users", "1", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["train"]["users"] == 1 and stats["eval"]["users"] == 1  # Mira trains, Tomas is held out
    assert stats["train"]["rewarded"] == 1 and stats["eval"]["reward_rate"] == 0.0
    sft = [json.loads(x) for x in (out / "sft" / "train.jsonl").read_text().splitlines()]
    assert len(sft) == 1 and sft[0]["messages"][-1]["role"] == "assistant"
    assert (out / "sft" / "eval.jsonl").read_text() == ""  # Tomas's only note led to a wrong decision
    kto = [json.loads(x) for x in (out / "kto" / "eval.jsonl").read_text().splitlines()]
    assert [k["label"] for k in kto] == [False] and kto[0]["completion"][0]["role"] == "assistant"
    assert (out / "sft" / "train.parquet").is_file() and json.loads((out / "stats.json").read_text()) == stats

    with pytest.raises(ConfigError, match="at least one must train"):
        build_pahf_dataset(PahfDataConfig(run=run, eval_users=2), tmp_path / "x")
    missing = memrl_cli("data", "pahf", "--run", tmp_path / "no", "--out", out, timeout=120)
    assert missing.returncode == 2 and "tasks.jsonl does not exist" in missing.stderr
