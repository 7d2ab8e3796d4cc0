"""A memrl world as a verifiers environment: `load_environment(world=...)`, the function verifiers looks up.

`vf.load_environment("memrl.integrations.verifiers", world="collab")` (or calling `load_environment` here) returns a
`MemrlWorldEnv`, a verifiers `MultiTurnEnv` (the classic stack, `verifiers.legacy`) over the world's own episodes
(memrl.integrations.worlds):
- the dataset has one row per seed (`seed`, `seed + 1`, ...): the prompt is the agent's system prompt and the
  episode's opening; the row's `info` keeps the seed;
- the env turn is memrl's: each model reply is one `Episode.step`, and the simulated user's answer is the env's
  response; the world's end (the user ends it, the turn limit) ends the rollout (`final_env_response`);
- the rubric is memrl's reward: `reward` (weight 1) is the world's reward of the finished episode (collab: the
  GRPO reward, `EpisodeRewardWeights.total` of the episode's parts; TOD: success; PAHF: correct), and every reward
  part of the last step is a metric (weight 0);
- the episode's record (per turn: the user's enforcement and the checkers' verdicts in collab, the outstanding
  slots in TOD) is `state["memrl"]["record"]`, with the parts and the reward beside it (`state_columns=["memrl"]`
  keeps it in a rollout's output).
`LocalChatClient` is verifiers' OpenAI chat client for `memrl serve` on CPU (`transformers serve`), which fails on
the `"tool_calls": null` verifiers writes into every assistant message it sends back: it leaves the nulls out.

A multi-session collab episode restarts the conversation at every session, which one linear `MultiTurnEnv`
conversation cannot show: it is served by `memrl world serve collab --sessions N` (OpenEnv) instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import verifiers as vf
from datasets import Dataset
from verifiers.clients import OpenAIChatCompletionsClient

from memrl.core.asyncs import run_sync
from memrl.core.errors import ConfigError
from memrl.envs.collab.served import CollabWorld
from memrl.envs.episode import Episode
from memrl.envs.served import ServedWorld
from memrl.integrations.worlds import build_world, served, system_prompt
from memrl.rollout.base import Message


def _plain(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _content(message: Any) -> str:
    content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        texts = [p.get("text", "") if isinstance(p, Mapping) else getattr(p, "text", "") for p in content]
        return "".join(t or "" for t in texts)
    return ""


class LocalChatClient(OpenAIChatCompletionsClient):
    """verifiers' chat-completions client without the null fields `transformers serve` (`memrl serve` on CPU) cannot
    read: `LocalChatClient(vf.ClientConfig(api_base_url=..., api_key_var=...))`."""

    async def to_native_prompt(self, messages: Any) -> tuple[Any, dict[str, Any]]:
        native, extra = await super().to_native_prompt(messages)
        return [{k: v for k, v in dict(m).items() if v is not None} for m in native], extra


class MemrlWorldEnv(vf.MultiTurnEnv):
    """A verifiers multi-turn environment whose env turn is a memrl world's simulated user (see the module)."""

    def __init__(self, world: ServedWorld, seeds: Sequence[int], **kwargs: Any) -> None:
        self.world = world
        system = system_prompt(world.name, world.cfg.reply_tokens if isinstance(world, CollabWorld) else 256)

        async def openings() -> list[list[Message]]:
            return [_plain(await world.episode(seed).reset(seed=seed)) for seed in seeds]

        rows = [
            {
                "prompt": [{"role": "system", "content": system}, *opening],
                "answer": "",
                "info": json.dumps({"seed": seed, "world": world.name}),
            }
            for seed, opening in zip(seeds, run_sync(openings()), strict=True)
        ]
        rubric = vf.Rubric(funcs=[self.reward], weights=[1.0])
        dataset = Dataset.from_list(rows)
        super().__init__(dataset=dataset, eval_dataset=dataset, rubric=rubric, max_turns=-1, **kwargs)
        for part in served(world.name).metrics:
            rubric.add_metric(self._metric(part))

    @staticmethod
    def _metric(part: str) -> Callable[..., Any]:
        async def metric(state: Any, **_: Any) -> float:
            return float(state["memrl"]["parts"][part])

        metric.__name__ = part
        return metric

    async def reward(self, state: Any, **_: Any) -> float:
        """The world's reward of the finished episode."""
        return float(state["memrl"]["reward"])

    async def setup_state(self, state: Any) -> Any:
        info = state["info"] if isinstance(state["info"], Mapping) else json.loads(state["info"])
        seed = int(info["seed"])
        episode: Episode = self.world.episode(seed)
        opening = await episode.reset(seed=seed)
        state["memrl"] = {"seed": seed, "record": None, "parts": {}, "reward": None, "steps": []}
        state["memrl_episode"] = episode
        state["memrl_seen"] = len(opening)
        return state

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> list[Message]:
        episode: Episode = state["memrl_episode"]
        step = await episode.step(_content(messages[-1]))
        new = _plain(step.observation[state["memrl_seen"] + 1 :])  # after the reply just given
        state["memrl_seen"] = len(step.observation)
        state["memrl"]["steps"].append({"reward": dict(step.reward), "info": json.loads(json.dumps(step.info))})
        if step.done:
            record = json.loads(json.dumps(episode.record()))
            state["memrl"] |= {
                "record": record,
                "parts": dict(step.reward),
                "reward": self.world.reward(record, step.reward),
            }
            state["final_env_response"] = new
        return new

    @vf.cleanup
    async def forget_episode(self, state: Any) -> None:
        state.pop("memrl_episode", None)


def load_environment(world: str = "collab", num_examples: int = 8, seed: int = 0, **config: Any) -> MemrlWorldEnv:
    """The verifiers environment of memrl world `world` (collab | tod | pahf): `num_examples` rows, seeds `seed`,
    `seed + 1`, ...; `config` is the world's config (the flags of `memrl world serve WORLD`, as keyword arguments:
    `task`, `user`, `max_turns`, `data`, ...)."""
    if num_examples < 1:
        raise ConfigError(f"num_examples must be at least 1, not {num_examples}")
    built = build_world(world, config)
    if isinstance(built, CollabWorld) and built.cfg.sessions > 1:
        built.close()
        raise ConfigError(
            "verifiers: a multi-session collab episode restarts the conversation each session, which one MultiTurnEnv "
            "conversation cannot hold; serve it with `memrl world serve collab --sessions N` (OpenEnv)"
        )
    return MemrlWorldEnv(built, [seed + i for i in range(num_examples)])
