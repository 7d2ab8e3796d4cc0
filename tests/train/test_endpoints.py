"""`memrl.train.endpoints`: the probe passes a real server and names what fails; a stage whose judge is unreachable
stops before training, in one try."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from memrl.core.errors import BackendError
from memrl.rollout.serve import LocalServer, free_port


@pytest.mark.slow
def test_probe_passes_a_real_server_and_names_a_wrong_model(smollm2_server: LocalServer) -> None:
    from memrl.rollout.config import OpenAIModelConfig
    from memrl.train.endpoints import Endpoint, probe_all

    good = Endpoint(
        "judge", OpenAIModelConfig(backend="openai", model=smollm2_server.name, endpoint=smollm2_server.url)
    )
    same = Endpoint("user", good.model)
    assert probe_all([good, same]) == []  # asked once: the same endpoint and model in two roles
    wrong = Endpoint("user", good.model.model_copy(update={"model": "no-such-model"}))
    problems = probe_all([good, wrong])
    assert len(problems) == 1 and problems[0].startswith("user: ")


def test_a_stage_with_an_unreachable_judge_stops_before_training(tmp_path: Path) -> None:
    from memrl.rewards.config import JudgeConfig, RewardConfig
    from memrl.rollout.config import OpenAIModelConfig
    from memrl.train.config import GRPOStage
    from memrl.train.endpoints import require_reachable, stage_endpoints

    url = f"http://127.0.0.1:{free_port()}/v1"
    judge = JudgeConfig(kind="llm", model=OpenAIModelConfig(backend="openai", model="m", endpoint=url))
    stage = GRPOStage(kind="grpo", model="policy", data="data", reward=RewardConfig(judge=judge))
    started = time.monotonic()
    with pytest.raises(BackendError, match=rf"judge: .*{url}"):
        require_reachable(stage_endpoints(stage))
    assert time.monotonic() - started < 10  # one try, no retries
