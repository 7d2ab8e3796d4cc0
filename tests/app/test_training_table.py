"""The training stage kinds read one registry (memrl.train.registry): every trainer a schema allows has an entry in
its kind's table, and the verl stages of both GRPO kinds ship to a Ray job by one rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import tomllib

from memrl.app.stages import online_rl, training
from memrl.app.stages.base import StageKind
from memrl.train.registry import BACKENDS, backend


@pytest.mark.parametrize(
    ("kind", "trained"),
    [(training.SFT, "sft"), (training.GRPO, "grpo"), (online_rl.online_kind("collab"), "online_grpo")],
)
def test_every_trainer_the_schema_allows_has_a_backend(kind: StageKind[Any], trained: str) -> None:
    allowed = get_args(kind.config.model_fields["trainer"].annotation)
    assert allowed == tuple(training.trainers(trained))


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


def test_every_registered_trainer_package_is_installed_and_independent() -> None:
    """The third file a trainer touches: pyproject's package list and the trainers' independence contract."""
    config = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    packages = config["tool"]["setuptools"]["packages"]
    contracts = config["tool"]["importlinter"]["contracts"]
    independent = next(c["modules"] for c in contracts if c["name"].startswith("Each trainer's package"))
    for name, entry in BACKENDS.items():
        assert isinstance(entry, str) and entry in packages and entry in independent, name
        assert backend(name).name == name
