"""Collaborator RL: whole collab sessions as GRPO rollouts on TRL, with a real tiny policy and the rule user.

The rollouts are played by the real TRL trainer (`GRPOTrainer._generate_single_turn` generates every agent turn),
and TRL's own scoring step (`_generate_and_score_completions`) consumes them: masks, rewards and advantages are
what TRL computes, not a re-implementation.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest

from memrl.core.errors import BackendError
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import AnswerKind, Problem
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.rows import CollabEpisodes, CollabRLConfig, policy_view, read_reply
from memrl.envs.collab.runner import select_profiles
from memrl.envs.collab.user_sim import RuleUserSimulator, UserSession, UserSimulator, UserTurn
from memrl.rewards.collab_episode import PARTS, EpisodeRewardWeights, episode_parts, preference_share
from memrl.rollout.base import Message
from memrl.train.online.chat_tokens import TurnTokens
from memrl.train.online.episodes import InProcess, episode_rows
from memrl.train.online.rollout import Player
from memrl.train.trl.online_rollout import EpisodeRollout
from memrl.train.trl.rewards import episode_funcs

MAX_TURNS = 3
REPLY_TOKENS = 12
ENV = CollabRLConfig(users=2, sessions=1, max_turns=MAX_TURNS, agent="oracle", seed=0)


class _FailingSession(UserSession):
    """The rule user, whose endpoint goes down at its second reaction (what an LLM user's BackendError looks like)."""

    def __init__(self, inner: UserSession) -> None:
        super().__init__(inner.profile, inner.problem, inner.max_turns)
        self.inner = inner
        self.reactions = 0

    async def open(self, greeting: str | None = None) -> UserTurn:
        return await self.inner.open(greeting)

    async def reply(self, turns: Sequence[Message]) -> UserTurn:
        self.reactions += 1
        if self.reactions == 2:
            raise BackendError("user endpoint http://127.0.0.1:9/v1 unreachable after 3 retries")
        return await self.inner.reply(turns)


class _EveryOtherUserFails(UserSimulator):
    def __init__(self, inner: UserSimulator) -> None:
        self.inner = inner
        self.started = 0

    def start(self, profile: UserProfile, problem: Problem, max_turns: int) -> UserSession:
        self.started += 1
        session = self.inner.start(profile, problem, max_turns)
        return _FailingSession(session) if self.started % 2 == 0 else session


def _player(tokenizer: Any, simulator: UserSimulator | None = None) -> Player:
    grader = Grader()
    episodes = CollabEpisodes(simulator or RuleUserSimulator(grader), grader, MAX_TURNS)
    source = InProcess(episodes, lambda spec: policy_view(spec, REPLY_TOKENS))
    return Player(source, TurnTokens.of(tokenizer), REPLY_TOKENS, max_episode_tokens=512)


@pytest.fixture(scope="module")
def trainer(tiny_qwen2: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real GRPOTrainer on tiny-qwen2 whose rollouts are collab episodes (2 sessions x 2 rollouts)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=REPLY_TOKENS,
        beta=0.0,
        use_cpu=True,
        report_to="none",
        seed=0,
    )
    rollout = EpisodeRollout(_player(tokenizer))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental")
        trainer = GRPOTrainer(
            model=tiny_qwen2,
            reward_funcs=[*episode_funcs(EpisodeRewardWeights)],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": episode_rows(ENV)}),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
    yield trainer
    rollout.close()


def _specs() -> list[str]:
    rows = episode_rows(ENV)
    return [row for row in rows for _ in range(2)]  # each session twice: a GRPO group of 2, as TRL's sampler gives


def _runs(mask: Sequence[int], ids: Sequence[int]) -> list[tuple[int, list[int]]]:
    """The completion cut where the mask changes: (mask value, ids) in order."""
    runs: list[tuple[int, list[int]]] = []
    for m, i in zip(mask, ids, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(i)
        else:
            runs.append((m, [i]))
    return runs


def test_the_masked_tokens_are_exactly_the_user_turns(trainer: Any) -> None:
    import torch

    torch.manual_seed(0)
    tokenizer = trainer.processing_class
    out = trainer.rollout_func(_specs(), trainer)

    assert out["logprobs"] is None  # TRL's transformers generation gives none, and TRL accepts that
    assert out["episode_status"] == ["done"] * 4
    user_turns_seen = 0
    for prompt, completion, mask, record in zip(
        out["prompt_ids"], out["completion_ids"], out["env_mask"], out["episode"], strict=True
    ):
        turns = record["turns"]
        assert len(mask) == len(completion)
        # The prompt is the agent's context and the user's opening, rendered by the policy's template.
        assert tokenizer.decode(prompt).endswith(f"user\n{turns[0]['content']}<|im_end|>\n<|im_start|>assistant\n")
        runs = _runs(mask, completion)
        replies = [t["content"] for t in turns if t["role"] == "assistant"]
        said = [t["content"] for t in turns[1:] if t["role"] == "user"]  # the user's turns after its opening
        # policy, user, policy, ..., policy: the episode ends on the agent's reply
        assert [m for m, _ in runs] == [1, 0] * len(said) + [1]
        assert len(replies) == len(said) + 1
        for (_, ids), reply in zip(runs[0::2], replies, strict=True):
            assert tokenizer.decode(ids, skip_special_tokens=True).strip() == reply
        for (_, ids), content in zip(runs[1::2], said, strict=True):
            text = tokenizer.decode(ids)
            cut = "<|im_end|>" if text.startswith("<|im_end|>") else ""  # a reply that hit its budget is closed here
            assert text == f"{cut}\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
        user_turns_seen += len(said)
    assert user_turns_seen > 0  # the rule user answered in every episode, so there was something to mask
    # Every reply the random tiny policy writes runs to its budget: each one counts as cut (TRL's own clipped_ratio
    # sees only an episode's last token).
    assert out["replies_cut"] == [1.0] * 4


def test_each_reward_part_reaches_the_trainer_and_a_failed_user_excludes_its_sample(trainer: Any) -> None:
    import torch

    torch.manual_seed(0)
    failing = _EveryOtherUserFails(RuleUserSimulator(Grader()))
    healthy_rollout = trainer.rollout_func
    trainer.rollout_func = EpisodeRollout(_player(trainer.processing_class, failing))
    trainer._metrics["train"].clear()
    trainer.model.train()  # as in TRL's training loop: metrics go under "train"
    try:
        scored = trainer._generate_and_score_completions([{"prompt": s} for s in _specs()])
    finally:
        trainer.rollout_func.close()
        trainer.rollout_func = healthy_rollout

    metrics = trainer._metrics["train"]
    for part in PARTS:
        assert f"rewards/{part}/mean" in metrics, part  # TRL logged every part under its own name
    assert metrics["episode/failed"] == [2.0] and metrics["episode/done"] == [2.0]  # counted, not hidden
    assert 0.0 <= metrics["episode/replies_cut"][0] <= 1.0
    logged = {part: list(values)[-4:] for part, values in trainer._logs["rewards"].items()}  # this batch's rows
    failed_rows = [i for i, value in enumerate(logged["task_success"]) if value != value]  # NaN: a None reward
    assert failed_rows == [1, 3]  # the second session of each pair failed mid-episode
    for part in PARTS:
        assert all(logged[part][i] != logged[part][i] for i in failed_rows)  # None from every function
    assert all(scored["advantages"][i] == 0 for i in failed_rows)  # TRL: unscorable, advantage 0
    # The environment's tokens are out of the loss: TRL's tool mask is the rollout's env_mask.
    assert "tool_mask" in scored and int(scored["tool_mask"].sum()) < int(scored["completion_mask"].sum())


def test_reward_parts_follow_the_episode_record() -> None:
    reaction = {"role": "user", "content": "Wait.", "enforce": True, "checker_decided": True}
    record = {
        "task_success": 1,
        "user_effort": 1,
        "length": 5,
        "preferences": ["direct", "proactive", "analytic"],
        "turns": [
            {"role": "user", "content": "Can you help?"},  # the opening: no reply to react to
            {"role": "assistant", "content": "Sure! 12"},
            reaction | {"checker_violated": ["direct"]},
            {"role": "assistant", "content": "12"},
            reaction | {"enforce": False, "checker_violated": []},
        ],
    }
    # One of three preferences broken in the first reply, none in the second: (2/3 + 1) / 2.
    assert episode_parts(record) == {"task_success": 1.0, "user_effort": -1.0, "preference": 5 / 6, "length": -5.0}
    assert preference_share({"turns": record["turns"][:2]}) is None  # no reaction yet: TRL sums the other parts
    funcs = episode_funcs(EpisodeRewardWeights)
    assert [f.__name__ for f in funcs] == list(PARTS)
    logged: list[tuple[str, float]] = []
    rewards = [f([None, None], episode=[record, None], episode_status=["done", "failed"]) for f in funcs]
    assert [r[1] for r in rewards] == [None] * len(PARTS)
    funcs[0]([None], episode=[None], episode_status=["over_budget"], log_metric=lambda k, v: logged.append((k, v)))
    assert dict(logged) == {"episode/done": 0.0, "episode/failed": 0.0, "episode/over_budget": 1.0}


def test_the_agent_reply_is_read_as_the_collab_agent_reads_it() -> None:
    assert read_reply('{"reasoning": "r", "response": "The answer is 12."}') == (
        "The answer is 12.",
        {"parse_failed": False},
    )
    assert read_reply("  12, I think ") == ("12, I think", {"parse_failed": True})


def test_a_text_reply_is_read_as_it_is_and_its_prompt_asks_for_no_json() -> None:
    assert read_reply("  12, I think ", "text") == ("12, I think", {"parse_failed": False})
    text_env = ENV.model_copy(update={"reply": "text"})
    row = json.loads(episode_rows(text_env)[0])
    system = policy_view(json.dumps(row), REPLY_TOKENS).context[0]["content"]
    assert row["reply"] == "text" and "JSON" not in system and f"within {REPLY_TOKENS} tokens" in system
    view = policy_view(episode_rows(ENV)[0], REPLY_TOKENS)
    assert '"response"' in view.context[0]["content"]  # the default stays the agent's JSON contract
    assert view.read_reply('{"response": "12"}') == ("12", {"parse_failed": False})
    del row["reply"]  # a row written before reply formats: JSON, as it was trained
    assert policy_view(json.dumps(row), REPLY_TOKENS).read_reply("12") == ("12", {"parse_failed": True})


def test_the_reply_that_time_cuts_off_still_gets_its_verdict() -> None:
    """The last reply of a session that runs out of turns is trained on: the user's unsaid reaction is kept."""
    import asyncio

    from memrl.envs.collab.session import CollabEpisode, SessionSpec

    user = UserProfile("u", "a student", ("blunt", "proactive", "analytic"))
    problem = Problem("p", "arith", "What is 3 + 4?", "7", AnswerKind.MATH)
    grader = Grader()

    async def play(reply: str) -> dict[str, Any]:
        episode = CollabEpisode(SessionSpec(user, problem, 0), RuleUserSimulator(grader), grader, max_turns=1)
        await episode.reset()
        step = await episode.step(reply)
        assert step.done
        return episode.record()

    cut = asyncio.run(play("Thank you so much for asking, it is a pleasure! I think it might be 6."))
    unsaid = cut["unsaid_reaction"]
    assert cut["ended_by"] == "max_turns" and "blunt" in unsaid["checker_violated"] and unsaid["enforce"]
    assert cut["user_effort"] == 0 and cut["turns"][-1]["role"] == "assistant"  # never said: no effort, no turn
    assert preference_share(cut) == pytest.approx(1 - len(unsaid["checker_violated"]) / 3)
    solved = asyncio.run(play("Since 3 + 4 adds four to three, the answer is 7. Next, you could try 3 + 5."))
    assert solved["unsaid_reaction"] is None and solved["ended_by"] == "user"  # the user said its reaction


def test_rows_are_train_users_with_their_oracle_notes() -> None:
    rows = [json.loads(r) for r in episode_rows(ENV)]
    assert len(rows) == ENV.users * ENV.sessions
    assert {r["agent"] for r in rows} == {"oracle"} and all(r["notes"].startswith("- ") for r in rows)
    eval_users = {p.id for p in select_profiles(ENV.eval_config().model_copy(update={"split": "eval"}))}
    assert not eval_users & {r["profile"]["id"] for r in rows}


@pytest.mark.slow
def test_collaborator_quickstart_smoke_trains_and_logs_every_part(memrl_cli: Any, tmp_path: Path) -> None:
    result = memrl_cli("run", "collaborator-quickstart", "--smoke", f"output_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    stage = tmp_path / "collab"
    assert (stage / "final" / "memrl_checkpoint.json").is_file()
    assert (stage / "training_curves.png").is_file()
    assert (tmp_path / "export" / "config.json").is_file()  # the adapter merged into a model `eval collab` serves
    history = json.loads((stage / "log_history.json").read_text())
    episodes = [json.loads(line) for line in (stage / "episodes.jsonl").read_text().splitlines()]
    steps = [row for row in history if "rewards/task_success/mean" in row]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        played = [e["record"] for e in episodes if e["step"] == row["step"] and e["status"] == "done"]
        assert played
        for part in ("task_success", "user_effort", "length"):  # what TRL logged is what the users lived
            assert row[f"rewards/{part}/mean"] == pytest.approx(fmean(episode_parts(r)[part] for r in played))
    # collab_heldout: base and trained played the same held-out sessions greedily, paired into report.json
    heldout = json.loads((tmp_path / "report.json").read_text())["heldout"]
    assert {"n", "unpaired", "base", "trained", "delta", "ci95"} <= set(heldout)
    assert (heldout["n"], heldout["unpaired"]) == (2, 0)
    for side in ("base", "trained", "delta", "ci95"):
        assert set(heldout[side]) == {"preference", "task_success", "user_effort", "length"}
    assert heldout["models"]["trained"] == str(tmp_path / "export")
    assert (tmp_path / "heldout.png").is_file()


def test_dr_grpo_normaliser_is_the_same_on_trl_and_verl(tiny_qwen2: str, tmp_path: Path) -> None:
    """collaborator-quickstart (loss dr_grpo): TRL divides by its max_completion_length, verl by loss_scale_factor;
    both must be the episode budget, while TRL's generation still stops each reply at max_turn_tokens."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from memrl.app.recipe import load_recipe
    from memrl.train.hf_trainer import TrainContext
    from memrl.train.online.config import STAGES
    from memrl.train.trl.online import online_args
    from memrl.train.verl.online_overrides import online_overrides

    stage = load_recipe("collaborator-quickstart").recipe.stages["collab"]
    assert isinstance(stage, STAGES["collab"]) and stage.loss == "dr_grpo"
    overrides = online_overrides(stage, model_path=tiny_qwen2, out_dir=tmp_path / "verl", experiment="x")
    prefix = "actor_rollout_ref.actor.loss_scale_factor="
    verl_norm = [int(o.removeprefix(prefix)) for o in overrides if o.startswith(prefix)]
    ctx = TrainContext(tmp_path / "trl", "collab", 0, "none", "x")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental")
        trainer = GRPOTrainer(
            model=tiny_qwen2,
            reward_funcs=[*episode_funcs(EpisodeRewardWeights)],
            args=GRPOConfig(**online_args(stage, ctx)),
            train_dataset=Dataset.from_dict({"prompt": episode_rows(ENV)}),
            rollout_func=lambda prompts, trainer: {},  # never called: only the trainer's set-up is read
        )
    assert verl_norm == [trainer.max_completion_length] == [stage.max_episode_tokens]  # TRL's dr_grpo divisor
    assert trainer.generation_config.max_new_tokens == stage.max_turn_tokens
