"""The judge keeps exactly the recipe's requests in flight: one bound (the model's `max_concurrency`), not two."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from memrl.app.recipe import load_recipe
from memrl.rewards.llm_judge import LLMJudge
from memrl.rewards.reward import RewardScorer
from memrl.rewards.types import GroundTruth
from memrl.rollout.openai_http import OpenAIBackend
from memrl.rollout.serve import free_port

LATENCY_S = 0.5  # long enough that all requests of a wave are on the wire before the first answer comes back


@dataclass
class FixedLatencyServer:
    """An OpenAI-compatible chat endpoint that answers a valid verdict after a fixed delay, counting requests."""

    port: int
    in_flight: int = 0
    peak: int = 0
    served: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(LATENCY_S)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.served += 1
        verdict = json.dumps({"reasoning": "Both preferences are recorded.", "score": 2})
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": verdict}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
        )


@pytest.fixture
def fixed_latency_server() -> Iterator[FixedLatencyServer]:
    server = FixedLatencyServer(free_port())
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    # A backlog above the default keeps a burst of new connections from waiting in the kernel queue.
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", server.port, backlog=1024).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_recipe_judge_keeps_its_max_concurrency_in_flight(fixed_latency_server: FixedLatencyServer) -> None:
    recipe = load_recipe(
        "reflector-qwen2.5-7b",
        [
            f"stages.grpo.reward.judge.model.endpoint={fixed_latency_server.url}",
            "stages.grpo.reward.judge.cache=false",
        ],
    ).recipe
    scorer = RewardScorer(recipe.stages["grpo"].reward)  # type: ignore[union-attr]
    n = 4 * 64  # four full waves
    completions = [
        json.dumps({"user_preferences_reasoning": "r", "agent_notes": f"- Use bullet points (case {i})."})
        for i in range(n)
    ]
    parts = scorer.score(completions, [GroundTruth(("Put that in bullet points.",))] * n)
    assert all(p.judge_score == 2.0 for p in parts) and fixed_latency_server.served == n
    assert fixed_latency_server.peak == 64  # the recipe's number: not the model block's default (16), nor more
    judge = scorer.judge
    assert isinstance(judge, LLMJudge) and isinstance(judge.backend, OpenAIBackend)
    assert judge.backend.peak_in_flight == 64


def test_trl_processes_share_the_judge_bound(
    fixed_latency_server: FixedLatencyServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `accelerate launch` each of 8 processes scores its own batches; the judge saw
    8 x 64 = 512 requests against the recipe's bound of 64. Each process now keeps 64 / 8 in flight."""
    from memrl.core.errors import ConfigError
    from memrl.train.trl.rewards import grpo_rewards

    recipe = load_recipe(
        "reflector-qwen2.5-7b",
        [f"stages.grpo.reward.judge.model.endpoint={fixed_latency_server.url}", "stages.grpo.reward.judge.cache=false"],
    ).recipe
    reward = recipe.stages["grpo"].reward  # type: ignore[union-attr]
    monkeypatch.setenv("WORLD_SIZE", "8")  # what accelerate sets in each of its processes
    funcs, _ = grpo_rewards(reward, tmp_path)
    n = 32
    completions = [
        json.dumps({"user_preferences_reasoning": "r", "agent_notes": f"- Bullets ({i})."}) for i in range(n)
    ]
    truth = [GroundTruth(("Put that in bullet points.",)).to_json()] * n
    scores = asyncio.run(funcs[0](prompts=[[]] * n, completions=completions, ground_truth=truth))
    assert fixed_latency_server.served == n and all(s is not None for s in scores)
    assert fixed_latency_server.peak == 64 // 8
    monkeypatch.setenv("WORLD_SIZE", "128")  # more processes than requests allowed: refused in one line
    with pytest.raises(ConfigError, match=r"reward.judge.model.max_concurrency 64 is fewer requests than the 128"):
        grpo_rewards(reward, tmp_path)
