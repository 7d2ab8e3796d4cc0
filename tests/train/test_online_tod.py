"""TOD RL: MS-TOD's proactive loop as online episodes, reached through the world registry, played by a real tiny
policy on TRL (its own generation and scoring step) and on verl (its own AgentLoopWorker and dataset)."""

from __future__ import annotations

import asyncio
import json
import math
import warnings
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
from support import FIXTURES

from memrl.envs.checker import check_episode
from memrl.envs.episode import PolicyReply
from memrl.envs.registry import online
from memrl.envs.tod.formats import Session, as_dicts
from memrl.envs.tod.metrics import session_scores
from memrl.envs.tod.prompts import reader_messages
from memrl.envs.tod.rows import TodRLConfig
from memrl.rewards.tod_episode import TodRewardWeights
from memrl.rollout.base import Message
from memrl.train.online.config import STAGES, OnlineGRPOStage
from memrl.train.online.episodes import episode_rows, in_process

ENV = TodRLConfig(data=FIXTURES / "mstod", individuals=2, sessions=4, max_turns=3)
REPLY_TOKENS = 12
WEIGHTS = TodRewardWeights(success=1.0, slot_accuracy=0.5, turns=0.1)


@pytest.fixture(scope="module")
def rows() -> list[str]:
    return episode_rows(ENV)


def _goal(spec: str) -> dict[str, str]:
    state = Session.model_validate(json.loads(spec)["session"]).confirmation_state
    assert state is not None
    return dict(state.slot_values)


def test_rows_are_confirming_sessions_seen_as_the_model_reader_sees_them(rows: list[str]) -> None:
    assert len(rows) == 4 and len({json.loads(r)["key"] for r in rows}) == 4
    assert any(json.loads(r)["memory"] for r in rows)  # memory selected from the individuals' earlier sessions
    tod = online("tod")
    for spec in rows:
        row, session = json.loads(spec), Session.model_validate(json.loads(spec)["session"])
        view = tod.view(spec, REPLY_TOKENS)
        context = session.context()
        # exactly the LLM reader's prompt of `eval tod`: its instructions with this row's memory and unsettled slots
        assert [*view.context, *view.opening] == reader_messages(as_dicts(context), row["memory"], row["missing"])
        assert set(row["missing"]) <= set(_goal(spec))
        assert view.read_reply(" ASSISTANT: Booked. ") == ("Booked.", {"parse_failed": False})
        assert view.read_reply("  ") == ("", {"parse_failed": True})


def test_an_unknown_data_folder_fails_in_one_line(tmp_path: Path) -> None:
    from memrl.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"no schema\.json"):
        TodRLConfig(data=tmp_path).rows()


def test_a_rows_episode_conforms_and_its_reward_is_the_worlds_outcome(rows: list[str]) -> None:
    spec = rows[0]
    goal = _goal(spec)
    first, *rest = goal.items()
    partial = ", ".join(v for _, v in rest)  # the confirmation misses the first slot; the next reply fixes it
    tod = online("tod")

    opening = len(Session.model_validate(json.loads(spec)["session"]).context())

    async def policy(observation: list[Message]) -> PolicyReply:
        said = sum(m["role"] == "assistant" for m in observation[opening:])
        return tod.view(spec, REPLY_TOKENS).read_reply(f"Booked: {partial}." if said == 0 else f"Also {first[1]}.")

    episodes = ENV.episodes()
    asyncio.run(check_episode(episodes.episode(spec), policy))
    episode = episodes.episode(spec)

    async def play() -> dict[str, Any]:
        observation = await episode.reset()
        while not (step := await episode.step(*_reply(await policy(observation)))).done:
            observation = step.observation
        return episode.record()

    record = asyncio.run(play())
    parts = TodRewardWeights.parts(record)
    scores = session_scores(record["confirmation"], goal, record["dte"], record["success"], [], [])
    assert parts == {"success": 1.0, "slot_accuracy": scores["slot_accuracy"], "turns": -2.0}
    assert 0 < parts["slot_accuracy"] < 1  # what `eval tod` scores the confirmation, not a copy of it
    assert WEIGHTS.total(parts) == pytest.approx(1.0 + 0.5 * scores["slot_accuracy"] - 0.2)


def _reply(reply: PolicyReply) -> tuple[str]:
    assert isinstance(reply, tuple)
    return (reply[0],)


def _stage(**update: Any) -> OnlineGRPOStage:
    fields: dict[str, Any] = {
        "kind": "tod_grpo",
        "trainer": "verl",
        "model": "policy",
        "env": ENV,
        "reward": WEIGHTS,
        "lora": None,
        "batch_size": 2,
        "rollouts": 2,
        "max_turn_tokens": REPLY_TOKENS,
        "max_episode_tokens": 256,
        "max_prompt_length": 2048,
    }
    return STAGES["tod"](**(fields | update))


def test_trl_plays_tod_episodes_and_scores_every_part(tiny_qwen2: str, tmp_path: Path, rows: list[str]) -> None:
    """TRL's own generation plays the episodes (`rollout_func`), its own scoring step reads the parts."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from memrl.train.online.chat_tokens import TurnTokens
    from memrl.train.online.rollout import Player
    from memrl.train.trl.online_rollout import EpisodeRollout
    from memrl.train.trl.rewards import episode_funcs

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=REPLY_TOKENS,
        beta=0.0,
        use_cpu=True,
        report_to="none",
        seed=0,
    )
    player = Player(in_process(ENV, REPLY_TOKENS), TurnTokens.of(tokenizer), REPLY_TOKENS, max_episode_tokens=512)
    rollout = EpisodeRollout(player)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental")
        trainer = GRPOTrainer(
            model=tiny_qwen2,
            reward_funcs=[*episode_funcs(TodRewardWeights)],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": rows}),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
    torch.manual_seed(0)
    trainer.model.train()
    try:
        specs = [spec for spec in rows[:2] for _ in range(2)]
        scored = trainer._generate_and_score_completions([{"prompt": s} for s in specs])
        out = rollout(specs, trainer)
    finally:
        rollout.close()
    metrics = trainer._metrics["train"]
    for part in TodRewardWeights.names():
        assert f"rewards/{part}/mean" in metrics, part
    assert metrics["episode/done"] == [4.0] and metrics["episode/failed"] == [0.0]
    records = out["episode"]
    assert out["episode_status"] == ["done"] * 4 and all(r["turns"][0]["speaker"] == "assistant" for r in records)
    # the random policy never states the goal: the rule user corrects it each time, up to the turn limit
    assert all(r["dte"] == ENV.max_turns and not r["success"] for r in records)
    for mask, record in zip(out["env_mask"], records, strict=True):
        users = sum(t["speaker"] == "user" for t in record["turns"])
        assert users == ENV.max_turns - 1 and 0 in mask  # the user's corrections are in the completion, masked
    assert int(scored["tool_mask"].sum()) < int(scored["completion_mask"].sum())


def test_verl_plays_tod_through_the_same_registry(tiny_qwen2: str, tmp_path: Path) -> None:
    """verl's AgentLoopWorker on the stage's parquet: the loop named `memrl_tod`, the parts summed to the score."""
    pytest.importorskip("verl")
    from test_online_verl import rollout
    from verl.trainer.ppo.reward import extract_reward

    from memrl.train.verl.online_data import agent_name
    from memrl.train.verl.online_rollouts import rollout_history

    output, _, tokenizer = rollout(tiny_qwen2, tmp_path, _stage(env=ENV.model_copy(update={"sessions": 2})))
    assert len(output) == 4 and set(output.non_tensor_batch["agent_name"]) == {agent_name("tod")}
    scores, info = extract_reward(output)
    episodes = [json.loads(e) for e in info["episode"]]
    assert [e["status"] for e in episodes] == ["done"] * 4
    for i, score in enumerate(scores.sum(-1).tolist()):
        parts = {p: info[p][i] for p in TodRewardWeights.names()}
        assert parts == TodRewardWeights.parts(episodes[i]["record"])
        assert score == pytest.approx(WEIGHTS.total(parts)) and not math.isnan(score)
    prompt = tokenizer.decode(output.batch["prompts"][0].tolist(), skip_special_tokens=True)
    assert "Facts remembered from earlier conversations" in prompt  # the reader's prompt, from the row's view
    dump = {k: v.tolist() for k, v in info.items()}
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    score = scores.sum(-1).tolist()
    RayPPOTrainer._write_generations(["p"] * 4, ["r"] * 4, [None] * 4, score, dump, str(tmp_path / "dump"), 1)
    (row,) = rollout_history(tmp_path / "dump", TodRewardWeights.names())
    assert row["rewards/turns/mean"] == pytest.approx(fmean(info["turns"]))


def test_a_tod_stage_on_verl_composes_against_verl_and_leaves_actors_to_trl(tmp_path: Path) -> None:
    pytest.importorskip("verl")
    from memrl.train.verl.online_overrides import online_overrides
    from memrl.train.verl.validate import PPO_CONFIG, validate_overrides

    tod = _stage(batch_size=4)  # 8 samples an update: one per GPU of the default cluster
    validate_overrides(PPO_CONFIG, online_overrides(tod, model_path="m", out_dir=tmp_path, experiment="t"))
    with pytest.raises(ValueError, match=r"env\.workers is for trainer trl"):
        _stage(env=ENV.model_copy(update={"workers": 2}))


@pytest.mark.slow
def test_tod_online_quickstart_smoke_trains_and_logs_every_part(memrl_cli: Any, tmp_path: Path) -> None:
    args = ("run", "tod-online-quickstart", "--smoke", f"stages.mstod.sgd_dir={FIXTURES / 'sgd'}")
    result = memrl_cli(*args, f"output_dir={tmp_path}", cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    stage = tmp_path / "tod"
    assert (stage / "final" / "memrl_checkpoint.json").is_file()
    assert (stage / "final" / "adapter_config.json").is_file()  # LoRA: the adapter is what was trained
    assert (stage / "checkpoint-2").is_dir() and (stage / "training_curves.png").is_file()
    assert (tmp_path / "export" / "config.json").is_file()
    history = json.loads((stage / "log_history.json").read_text())
    episodes = [json.loads(line) for line in (stage / "episodes.jsonl").read_text().splitlines()]
    steps = [row for row in history if "rewards/success/mean" in row]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        played = [e["record"] for e in episodes if e["step"] == row["step"] and e["status"] == "done"]
        assert played
        for part in TodRewardWeights.names():  # what TRL logged is what the episodes lived
            value = fmean(TodRewardWeights.parts(r)[part] or 0.0 for r in played)
            assert row[f"rewards/{part}/mean"] == pytest.approx(value)
