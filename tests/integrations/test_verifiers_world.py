"""verifiers' own rollout code plays a memrl world: `vf.load_environment("memrl.integrations.verifiers", ...)`.

The environment verifiers loads has memrl's user as its env turn and memrl's reward as its rubric; against `memrl
serve` on the tiny model, `Environment.evaluate` scores a collab episode whose record is the one memrl's own driver
writes for the same seed and the replies the model gave.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

vf = pytest.importorskip("verifiers")

from memrl.core.errors import ConfigError  # noqa: E402
from memrl.envs.episode import play  # noqa: E402
from memrl.integrations.verifiers import LocalChatClient, MemrlWorldEnv, load_environment  # noqa: E402
from memrl.integrations.worlds import build_world  # noqa: E402

CLOCK = ("started_at", "finished_at")


def _strip_clock(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in CLOCK}


def _content(message: Any) -> str:
    return message["content"] if isinstance(message, dict) else message.content


def test_load_environment_is_what_verifiers_finds() -> None:
    env = vf.load_environment("memrl.integrations.verifiers", world="collab", num_examples=2, seed=5, max_turns=3)
    assert isinstance(env, MemrlWorldEnv) and isinstance(env, vf.MultiTurnEnv)
    rows = env.get_dataset().to_list()
    assert [json.loads(r["info"])["seed"] for r in rows] == [5, 6]
    episode = build_world("collab", {"max_turns": 3}).episode(5)
    opening = asyncio.run(episode.reset(seed=5))
    assert [_content(m) for m in rows[0]["prompt"][1:]] == [m["content"] for m in opening]  # the user opens
    assert rows[0]["prompt"][0]["role"] == "system"
    with pytest.raises(ConfigError, match="sessions"):
        load_environment(world="collab", sessions=2)
    with pytest.raises(ConfigError, match="unknown world 'chess'"):
        load_environment(world="chess")


@pytest.mark.slow
def test_verifiers_rollout_scores_a_collab_episode_as_memrl_does(tiny_server: tuple[str, str]) -> None:
    url, name = tiny_server
    env = vf.load_environment("memrl.integrations.verifiers", world="collab", num_examples=1, seed=13, max_turns=3)
    os.environ["MEMRL_TEST_KEY"] = "none"
    client = LocalChatClient(vf.ClientConfig(api_base_url=url, api_key_var="MEMRL_TEST_KEY", max_retries=1))
    results = asyncio.run(
        env.evaluate(
            client,
            name,
            sampling_args={"temperature": 0.0, "max_tokens": 24},
            num_examples=1,
            state_columns=["memrl"],
            on_progress=lambda *a, **k: None,
        )
    )
    [output] = results["outputs"]
    memrl = output["memrl"]
    replies = [
        _content(m) for m in output["completion"] if (m["role"] if isinstance(m, dict) else m.role) == "assistant"
    ]
    print(f"verifiers scored the collab episode: reward {output['reward']}, metrics {output['metrics']}")
    print(f"{len(replies)} replies from the tiny model; record keys: {sorted(memrl['record'])[:6]}...")
    assert replies and memrl["record"] is not None

    # memrl's own driver, the same seed and the replies the model gave
    world = build_world("collab", {"max_turns": 3})
    episode = world.episode(13)
    given = iter(replies)

    async def policy(observation: list[Any]) -> str:
        return next(given)

    final = asyncio.run(play(episode, policy, seed=13))
    record = json.loads(json.dumps(episode.record()))
    assert _strip_clock(memrl["record"]) == _strip_clock(record)
    assert memrl["parts"] == final.reward
    assert output["reward"] == pytest.approx(world.reward(record, final.reward))
    assert {k: output["metrics"][k] for k in final.reward} == final.reward
