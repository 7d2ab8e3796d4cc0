"""Reflection data from real collab sessions (rule user + tiny model), and every trainer format loaded back."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from memrl.app.cli.data import data_app
from memrl.core.errors import ConfigError
from memrl.core.outcomes import NothingDoneError
from memrl.core.preferences import REQUESTS, TAXONOMY
from memrl.data_gen.gold import NOTES
from memrl.data_gen.reflection import (
    ReflectionRecord,
    build_from_sessions,
    build_records,
    check_disjoint,
    write_dataset,
)
from memrl.envs.collab.agents import AgentKind, AgentMemory, CollabAgent, Reflector
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import Problem, load_problems, split_problems
from memrl.envs.collab.profiles import UserProfile, sample_profiles, split_profiles
from memrl.envs.collab.prompts import NO_NOTES, reflection_messages
from memrl.envs.collab.records import SessionRecord, read_sessions
from memrl.envs.collab.session import SessionSpec, run_session
from memrl.envs.collab.user_sim import RuleUserSimulator
from memrl.rewards.format import REFLECTION_KEYS
from memrl.rollout.base import SamplingParams

Sessions = dict[str, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def sessions(tiny_qwen2: str) -> Sessions:
    """4 train and 2 eval users x 2 sessions from the collab splits: users and problems disjoint."""
    from memrl.rollout.hf_local import HFBackend

    backend = HFBackend(tiny_qwen2)
    params = SamplingParams(temperature=0.0, max_tokens=16, seed=0)
    agent = CollabAgent(AgentKind.MEMORY, backend, params, Reflector(backend, params), params)
    grader = Grader()
    train_users, eval_users = split_profiles(sample_profiles(20, seed=0), 2, seed=0)
    train_problems, eval_problems = split_problems(load_problems("arith", limit=40, seed=0), 10, seed=0)

    async def run(profiles: list[UserProfile], problems: list[Problem]) -> list[dict[str, Any]]:
        records = []
        for u, profile in enumerate(profiles):
            memory = AgentMemory()
            for index in range(2):
                spec = SessionSpec(profile, problems[2 * u + index], index)
                record, memory = await run_session(spec, agent, RuleUserSimulator(grader), grader, memory, 3)
                records.append(record.to_dict())
        return records

    return {
        "train": asyncio.run(run(train_users[:4], train_problems)),
        "eval": asyncio.run(run(eval_users, eval_problems)),
    }


@pytest.fixture(scope="module")
def session_files(sessions: Sessions, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sessions")
    paths = {}
    for split, records in sessions.items():
        paths[split] = folder / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in records))
    return paths


def _typed(rows: list[dict[str, Any]]) -> list[SessionRecord]:
    """Session rows (edited as JSON by these tests) as the records `memrl data reflection` reads."""
    return [SessionRecord.from_dict(row, "test") for row in rows]


def _source(sessions: Sessions, record: ReflectionRecord) -> dict[str, Any]:
    return next(s for split in sessions.values() for s in split if f"{s['user_id']}/s{s['session']}" == record.key)


def _violated_in_order(session: dict[str, Any]) -> list[str]:
    ids: list[str] = []
    for turn in session["turns"]:
        if turn["role"] == "user" and turn.get("enforce"):
            ids += [pid for pid in turn["violated"] if pid not in ids]
    return ids


def test_every_preference_has_a_gold_note() -> None:
    assert set(NOTES) == set(TAXONOMY)
    assert len({spec.line() for spec in NOTES.values()}) == len(TAXONOMY)


def test_composed_gold_follows_the_rule_users_labels_and_chains_notes(sessions: Sessions) -> None:
    train, eval_, skipped = build_from_sessions(_typed(sessions["train"]), _typed(sessions["eval"]))
    assert train and eval_
    assert skipped.total == len(sessions["train"]) + len(sessions["eval"]) - len(train) - len(eval_)
    by_key = {r.key: r for r in [*train, *eval_]}
    assert any(r.enforced for r in by_key.values())
    for record in by_key.values():
        source = _source(sessions, record)
        assert list(record.enforced) == _violated_in_order(source)
        assert record.enforcements == tuple(source["enforcing_utterances"])
        for turn in source["turns"]:  # each enforcing utterance is the rule user's request for what it names
            if turn["role"] == "user" and turn.get("enforce"):
                assert all(REQUESTS[pid] in turn["content"] for pid in turn["violated"])
        assert list(record.prompt) == reflection_messages(record.notes_before, record.conversation)
        assert record.gold_notes.splitlines() == [NOTES[pid].line() for pid in record.expected]
        assert json.loads(record.gold) == dict(
            zip(REFLECTION_KEYS, (record.gold_reasoning, record.gold_notes), strict=True)
        )
        assert set(record.expected) <= set(record.preferences)
        if record.session == 0:
            assert record.notes_before == ""
            assert NO_NOTES in record.prompt[-1]["content"]
            assert record.expected == record.enforced
        else:  # the chain: session 1 starts from session 0's gold notes, and what it expects accumulates
            previous = by_key[f"{record.user_id}/s0"]
            assert record.notes_before == previous.gold_notes
            assert record.notes_before in record.prompt[-1]["content"]
            assert record.expected[: len(previous.expected)] == previous.expected
            assert set(record.expected) == set(previous.expected) | set(record.enforced)


def test_carried_preferences_and_skip_reasons(sessions: Sessions) -> None:
    user = next(
        s["user_id"] for s in sessions["train"] if s["session"] == 0 and len(_violated_in_order(s)) >= 1
    )  # a user who enforced something in the first session
    first, second = (copy.deepcopy(s) for s in sessions["train"] if s["user_id"] == user)
    pid = _violated_in_order(first)[0]
    for turn in first["turns"]:  # session 0 now labels one preference only
        if turn.get("enforce"):
            turn["violated"] = [pid]
    quiet = copy.deepcopy(second)
    for turn in quiet["turns"]:
        turn["enforce"] = False
    quiet["enforcing_utterances"] = []

    records, skipped = build_records(_typed([first, quiet]))
    assert [r.session for r in records] == [0, 1]
    assert records[0].expected == (pid,)
    assert records[1].enforced == ()  # nothing new, but notes to keep: still a sample
    assert records[1].expected == (pid,)
    assert records[1].gold_notes == records[1].notes_before == records[0].gold_notes
    assert "no change" in records[1].gold_reasoning and NOTES[pid].label in records[1].gold_reasoning

    grown, _ = build_records(_typed([first, second]))
    assert grown[1].expected == (pid, *[p for p in _violated_in_order(second) if p != pid])

    quiet_first = copy.deepcopy(quiet)
    quiet_first["session"] = 0
    unlabelled = copy.deepcopy(second)  # an LLM user enforces without naming ids
    unlabelled["user_id"] = "someone-else"
    for turn in unlabelled["turns"]:
        turn["violated"] = []
    records, skipped = build_records(_typed([quiet_first, unlabelled]))
    assert records == []
    assert (skipped.nothing_to_learn, skipped.unlabelled, skipped.teacher_unparsed) == (1, 1, 0)


def test_teacher_gold_comes_from_the_runs_reflection(sessions: Sessions) -> None:
    train = sessions["train"]
    records, skipped = build_records(_typed(train), gold="teacher")
    # The tiny model writes no JSON: every reflection is unusable, each skip counted.
    assert records == []
    assert skipped.teacher_unparsed == sum(bool(s["enforcing_utterances"] or s["notes_before"]) for s in train)
    assert skipped.teacher_unparsed + skipped.nothing_to_learn == len(train)

    taught = copy.deepcopy(train[:2])
    reply = {"user_preferences_reasoning": "They asked for a TL;DR.", "agent_notes": "- End with a TL;DR."}
    taught[0]["reflection_raw"] = "```json\n" + json.dumps(reply) + "\n```"
    taught[1]["notes_before"] = "- End with a TL;DR."
    taught[1]["reflection_raw"] = '{"user_preferences_reasoning": "more", "agent_notes": ["TL;DR", "bullets"]}'
    records, skipped = build_records(_typed(taught), gold="teacher")
    assert [r.gold_notes for r in records] == ["- End with a TL;DR.", "- TL;DR\n- bullets"]
    assert (
        records[0].gold
        == '{"user_preferences_reasoning":"They asked for a TL;DR.","agent_notes":"- End with a TL;DR."}'
    )
    assert records[1].notes_before == "- End with a TL;DR."  # the run's own notes, not a composed chain
    assert [list(r.enforced) for r in records] == [_violated_in_order(s) for s in taught]


def test_disjointness_is_checked(sessions: Sessions) -> None:
    train, _, _ = build_from_sessions(_typed(sessions["train"]), _typed([]))
    with pytest.raises(ConfigError, match=r"share \d+ user\(s\), e\.g\. 'user-") as exc:
        build_from_sessions(_typed(sessions["train"]), _typed(sessions["train"][:1]))
    assert "\n" not in str(exc.value)
    same_problem = copy.deepcopy(sessions["eval"][:1])
    same_problem[0]["problem_id"] = train[0].problem_id
    with pytest.raises(ConfigError, match=f"problem.*{train[0].problem_id}"):
        build_from_sessions(_typed(sessions["train"]), _typed(same_problem))
    check_disjoint(train, [])


def test_every_format_loads_back_in_its_trainer(sessions: Sessions, tiny_qwen2: str, tmp_path: Path) -> None:
    import datasets
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    from verl.utils.dataset.rl_dataset import RLHFDataset

    train, eval_, skipped = build_from_sessions(_typed(sessions["train"]), _typed(sessions["eval"]))
    stats = write_dataset(train, eval_, tmp_path, skipped)
    assert (stats.train.records, stats.eval.records) == (len(train), len(eval_))
    assert stats.train.users == len({r.user_id for r in train})
    assert sum(stats.train.enforced.values()) == sum(len(r.enforced) for r in train)
    assert json.loads((tmp_path / "stats.json").read_text())["train"]["skipped"]["total"] == skipped.train.total
    assert [ReflectionRecord.from_dict(json.loads(line)) for line in (tmp_path / "train.jsonl").open()] == train

    # TRL: conversational SFT rows and GRPO prompts with the ground truth as a JSON string.
    sft = datasets.load_dataset("json", data_files=str(tmp_path / "sft/train.jsonl"))["train"]
    assert [m["role"] for m in sft[0]["messages"]] == ["user", "assistant"]
    assert sft[0]["messages"][-1]["content"] == train[0].gold
    rl = datasets.load_dataset("json", data_files=str(tmp_path / "rl/eval.jsonl"))["train"]
    assert rl[0]["prompt"] == list(eval_[0].prompt)
    assert json.loads(rl[0]["ground_truth"]) == eval_[0].ground_truth()
    assert rl[0]["key"] == eval_[0].key

    # verl: its own dataset classes, with a real tokenizer, on CPU.
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    config = OmegaConf.create({"max_prompt_length": 100_000, "cache_dir": str(tmp_path / "verl-cache")})
    rl_ds = RLHFDataset(str(tmp_path / "rl/train.parquet"), tokenizer, config)
    assert len(rl_ds) == len(train)
    item = rl_ds[1]
    assert item["data_source"] == "memrl/collab_reflection"
    assert item["ability"] == "reflection"
    assert item["raw_prompt"] == list(train[1].prompt)
    assert item["reward_model"] == {"style": "rule", "ground_truth": train[1].ground_truth()}
    assert item["extra_info"] == {
        "split": "train", "index": 1, "key": train[1].key, "user_id": train[1].user_id,
        "problem_id": train[1].problem_id, "session": train[1].session,
    }  # fmt: skip
    assert item["index"] == 1
    sft_ds = MultiTurnSFTDataset(str(tmp_path / "sft/eval.parquet"), tokenizer, {"max_length": 8192})
    assert len(sft_ds) == len(eval_)
    sample = sft_ds[0]
    trained = sample["input_ids"][sample["loss_mask"].bool()]
    assert eval_[0].gold in tokenizer.decode(trained)  # the loss covers the gold reflection, not the prompt
    assert "# Notes so far" not in tokenizer.decode(trained)

    # LLaMA-Factory: dataset_info names files that exist and columns and roles that are there.
    lf = tmp_path / "llamafactory"
    info = json.loads((lf / "dataset_info.json").read_text())
    assert set(info) == {"memrl_reflection_train", "memrl_reflection_eval"}
    for name, entry in info.items():
        assert entry["formatting"] == "sharegpt"
        rows = json.loads((lf / entry["file_name"]).read_text())
        assert len(rows) == (len(train) if name.endswith("train") else len(eval_))
        messages = rows[0][entry["columns"]["messages"]]
        tags = entry["tags"]
        assert [m[tags["role_tag"]] for m in messages] == [tags["user_tag"], tags["assistant_tag"]]
        assert all(isinstance(m[tags["content_tag"]], str) for m in messages)


def test_cli_writes_the_folder_and_prints_counts(session_files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "data"
    args = ["reflection", "--train-sessions", str(session_files["train"])]
    result = CliRunner().invoke(data_app, [*args, "--eval-sessions", str(session_files["eval"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "stats.json").read_text())
    assert f"train: {stats['train']['records']} records, {stats['train']['users']} users" in result.output
    assert "enforced in train: " in result.output
    for path in ("train.jsonl", "eval.jsonl", "sft/train.parquet", "rl/eval.parquet", "llamafactory/dataset_info.json"):
        assert (out / path).is_file(), path

    teacher = CliRunner().invoke(
        data_app, [*args, "--eval-sessions", str(session_files["eval"]), "--out", str(out), "--gold", "teacher"]
    )
    assert isinstance(teacher.exception, NothingDoneError)  # tiny-model reflections: nothing usable to train on
    line = str(teacher.exception)
    assert "no training records" in line and "teacher reflection did not parse" in line

    overlap = CliRunner().invoke(data_app, [*args, "--eval-sessions", str(session_files["train"]), "--out", str(out)])
    assert isinstance(overlap.exception, ConfigError)


def test_bad_session_files_fail_in_one_line(session_files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    good = session_files["train"].read_text().splitlines()
    bad.write_text(f"{good[0]}\n{{not json\n")
    with pytest.raises(ConfigError, match=rf"^{bad}:2: not valid JSON"):
        read_sessions(bad)
    bad.write_text(f"{good[0]}\n\n" + json.dumps({"user_id": "u"}) + "\n")
    with pytest.raises(ConfigError, match=rf"^{bad}:3: session record lacks session, problem_id"):
        read_sessions(bad)
    with pytest.raises(ConfigError, match="sessions file not found"):
        read_sessions(tmp_path / "missing.jsonl")
    result = CliRunner().invoke(
        data_app, ["reflection", "--train-sessions", str(bad), "--eval-sessions", str(bad), "--out", str(tmp_path)]
    )
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception).startswith(f"{bad}:3:")


def test_an_empty_split_is_refused_in_one_line_by_the_command_and_the_stage(tmp_path: Path) -> None:
    from support import memrl_in_process

    empty, one = tmp_path / "empty.jsonl", tmp_path / "one.jsonl"
    empty.write_text("\n")
    turns = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    record = {"user_id": "u", "session": 0, "problem_id": "p", "task": "t", "preferences": [], "turns": turns}
    one.write_text(json.dumps(record) + "\n")
    run = tmp_path / "run"
    paths = {
        "command": ["data", "reflection", "--train-sessions", one, "--eval-sessions", empty, "--out", tmp_path / "o"],
        "stage": ["run", "quickstart", "--smoke", "--stage", "data", f"output_dir={run}",
                  f"stages.data.train_sessions=[{one}]", f"stages.data.eval_sessions=[{empty}]"],
    }  # fmt: skip
    for path, argv in paths.items():
        code, err = memrl_in_process(argv)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and lines[-1].endswith(f"no session records in {empty}"), (path, err)
        assert lines[-1].startswith("memrl: error: "), (path, err)
    assert not (tmp_path / "o").exists() and not (run / "data" / "train.jsonl").exists()
