"""A world added through the registry alone (docs/online-rl.md, "Adding a world"): a toy world registered here conforms
to the episode protocol and trains one GRPO step on TRL with a real tiny policy, through the same online code the
bundled worlds use (its stage schema, episode source, reward functions and chart all come from its entry)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import Field
from support.echo import Echo

from memrl.envs.checker import check_episode
from memrl.envs.episode import PolicyReply
from memrl.envs.online import OnlineConfig, PolicyView
from memrl.envs.registry import WORLDS, Online, World, online, online_of, register
from memrl.rewards.episode import PartWeights, Record
from memrl.rewards.registry import REWARDS
from memrl.rollout.base import Message
from memrl.rollout.config import ModelConfig


class EchoEpisodes:
    def episode(self, spec: str) -> Echo:
        return Echo(json.loads(spec)["word"])

    def close(self) -> None:
        pass


class EchoConfig(OnlineConfig):
    words: list[str] = Field(default=["apple", "river"])
    seed: int = 0
    workers: int | None = None
    ray_address: str | None = None
    user_model: ModelConfig | None = None

    def rows(self) -> list[str]:
        return [json.dumps({"word": word}) for word in self.words]

    def episodes(self) -> EchoEpisodes:
        return EchoEpisodes()

    def plays(self) -> str:
        return f"with an echo user on {len(self.words)} words"


def echo_parts(record: Record) -> dict[str, float | None]:
    return {"hit": float(record["word"] in record["replies"][-1].lower()), "replies": -float(len(record["replies"]))}


class EchoWeights(PartWeights):
    hit: float = 1.0
    replies: float = 0.1

    parts = staticmethod(echo_parts)


def echo_view(spec: str, reply_tokens: int) -> PolicyView:
    word = json.loads(spec)["word"]
    context: list[Message] = [{"role": "system", "content": f"Reply in at most {reply_tokens} tokens."}]
    return PolicyView(context, str.strip, [{"role": "user", "content": f"Say the word {word}."}])


@pytest.fixture
def echo() -> Iterator[World]:
    entry = register(World("echo", Online(EchoConfig, EchoWeights, echo_view)))
    try:
        yield entry
    finally:
        del WORLDS["echo"], REWARDS["echo_episode"]


def test_a_registered_world_conforms_and_lists_its_reward(echo: World) -> None:
    assert online("echo") is echo.online and online_of(EchoConfig())[0] == "echo"
    assert REWARDS["echo_episode"].parts == ("hit", "replies")
    with pytest.raises(ValueError, match="registered already"):
        register(echo)
    (spec, _) = EchoConfig().rows()

    async def policy(observation: list[Message]) -> PolicyReply:
        return echo_view(spec, 8).read_reply("Pear?" if len(observation) == 1 else "Apple!")

    asyncio.run(check_episode(EchoConfig().episodes().episode(spec), policy))


@pytest.mark.slow  # trains
def test_a_registered_world_trains_one_grpo_step_on_trl(echo: World, tiny_qwen2: str, tmp_path: Path) -> None:
    from memrl.train.hf_trainer import TrainContext
    from memrl.train.online.config import online_stage
    from memrl.train.trl.online import train_online_grpo

    stage = online_stage("echo").model_validate(
        {
            "kind": "echo_grpo",
            "model": "policy",
            "lora": {"rank": 4, "alpha": 8},
            "max_steps": 1,
            "batch_size": 2,
            "rollouts": 2,
            "micro_batch_size": 4,
            "max_turn_tokens": 8,
            "max_episode_tokens": 64,
        }
    )
    assert isinstance(stage.env, EchoConfig) and isinstance(stage.reward, EchoWeights)
    final = train_online_grpo(stage, tiny_qwen2, TrainContext(tmp_path, "echo", 0, "none", "echo"))
    assert (final / "memrl_checkpoint.json").is_file()
    history = json.loads((tmp_path / "log_history.json").read_text())
    (logged,) = [row for row in history if "rewards/hit/mean" in row]
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and {e["status"] for e in episodes} == {"done"}
    replies = [-echo_parts(e["record"])["replies"] for e in episodes]  # type: ignore[operator]
    assert logged["rewards/replies/mean"] == pytest.approx(-sum(replies) / 4)
    assert (tmp_path / "training_curves.png").is_file()  # one panel per part of the world's reward
