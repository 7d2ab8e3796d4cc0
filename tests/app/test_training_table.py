"""The training stage kinds are a table: every trainer a schema allows has a backend entry, and the verl stages
of both GRPO kinds ship to a Ray job by one rule."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from memrl.app.stages import online_rl, training
from memrl.app.stages.base import StageKind
from memrl.app.stages.training import Trainer


@pytest.mark.parametrize(
    ("kind", "table"),
    [(training.SFT, training.SFT_TRAINERS), (training.GRPO, training.GRPO_TRAINERS),
     (online_rl.online_kind("collab"), online_rl.TRAINERS)],
)  # fmt: skip
def test_every_trainer_the_schema_allows_has_a_backend(kind: StageKind[Any], table: dict[str, Trainer[Any]]) -> None:
    allowed = get_args(kind.config.model_fields["trainer"].annotation)
    assert sorted(allowed) == sorted(table)


@pytest.mark.parametrize("kind", [training.GRPO, online_rl.online_kind("collab")])
@pytest.mark.parametrize("trainer", ["trl", "verl"])
def test_both_grpo_kinds_join_the_jobs_cluster_the_same_way(kind: StageKind[Any], trainer: str) -> None:
    name = get_args(kind.config.model_fields["kind"].annotation)[0]
    fields = {"kind": name, "trainer": trainer, "model": "policy", "data": "d"}
    stage = kind.config.model_validate({k: v for k, v in fields.items() if k in kind.config.model_fields})
    raw: dict[str, Any] = {"cluster": {"ray_address": "http://head:8265"}, "overrides": ["a=1"]}
    job = kind.job(stage, raw, "stage", "http://head:8265")
    assert job.gpus == 0
    assert job.gpus_if_any == (8 if trainer == "trl" else 0)  # TRL trains in the job, on GPUs where there are some
    if trainer == "trl":
        assert raw == {"cluster": {"ray_address": "http://head:8265"}, "overrides": ["a=1"]}
    else:
        assert raw == {"cluster": {"ray_address": None}, "overrides": ["a=1", "+ray_kwargs.ray_init.address=auto"]}
