"""A trainer backend added through the registry alone (docs/architecture.md, "Adding a trainer backend"): a toy
backend registered here is a trainer the `sft` schema accepts, placement lays out, and `memrl run` trains with
through the app's table, with nothing else edited."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
import yaml
from support import memrl_in_process

from memrl.app.config import Recipe
from memrl.app.preflight import preflight
from memrl.app.stages import training
from memrl.train import registry
from memrl.train.config import SFTStage
from memrl.train.placement import Layout, layout, stage_plan
from memrl.train.registry import Needs, StageRunner, TrainedKind, TrainerBackend
from memrl.train.stage_run import StageRun

TOY_LAYOUT = Layout("policy (toy, one process)", weights="replicated")


def _run(stage: SFTStage, where: StageRun, base: str, data: Path) -> None:
    final = where.out_dir / "final"
    final.mkdir(parents=True)
    (final / "toy.json").write_text(json.dumps({"base": base, "data": str(data), "lr": stage.lr}))


def _describe(stage: SFTStage, where: StageRun, base: str, data: Path) -> list[str]:
    return [f"toy trainer: {base} on {data / 'toy.jsonl'}, into {where.out_dir / 'final'}"]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> TrainerBackend:
    """The toy backend: its runner in a module of its own (as `train/<name>/backend.py`), its entry in the table."""
    module = types.ModuleType("toy_trainer_backend")
    module.SFT = StageRunner(_run, _describe)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    found = TrainerBackend(
        name="toy",
        summary="a test's trainer",
        kinds={"sft": TrainedKind(f"{module.__name__}:SFT", TOY_LAYOUT, files=("toy.jsonl",))},
    )
    monkeypatch.setitem(registry.BACKENDS, "toy", found)
    return found


def _recipe(tmp_path: Path, trainer: str, kind: str = "sft") -> dict[str, object]:
    data = tmp_path / "data"
    if not data.is_dir():
        data.mkdir()
        (data / "toy.jsonl").write_text('{"prompt": "p", "completion": "c"}\n')
    stage: dict[str, object] = {"kind": kind, "trainer": trainer, "model": "policy", "lr": 0.5}
    stage |= {"data": str(data)}
    return {
        "name": "toy",
        "output_dir": str(tmp_path / "run"),
        "models": {"policy": {"backend": "hf", "model": "toy-base-0.5b"}},
        "logging": {"backend": "none"},
        "stages": {"sft": stage},
    }


def test_a_registered_trainer_validates_is_laid_out_and_has_an_entry(toy: TrainerBackend, tmp_path: Path) -> None:
    stage = Recipe.model_validate(_recipe(tmp_path, "toy")).stages["sft"]
    assert isinstance(stage, SFTStage) and stage.trainer == "toy"
    assert layout(stage) is TOY_LAYOUT
    assert stage_plan(stage, "toy-base-0.5b").lines()[1].startswith("  policy (toy, one process): toy-base-0.5b")
    assert list(training.trainers("sft")) == ["trl", "verl", "llamafactory", "toy"]
    assert "toy" not in training.trainers("grpo")


def test_a_trainer_the_registry_lacks_or_that_trains_another_kind_is_one_line(
    toy: TrainerBackend, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="Input should be 'trl', 'verl' or 'llamafactory'"):
        Recipe.model_validate(_recipe(tmp_path, "nosuch"))
    grpo = _recipe(tmp_path, "toy", kind="grpo")
    with pytest.raises(ValueError, match="Input should be 'trl' or 'verl'"):  # the toy trains sft only
        Recipe.model_validate(grpo)


def test_memrl_run_trains_with_the_registered_trainer(toy: TrainerBackend, tmp_path: Path) -> None:
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(tmp_path, "toy")))
    code, err = memrl_in_process(["run", recipe, "--dry-run"], stdout=True)
    assert code == 0, err
    assert f"toy trainer: toy-base-0.5b on {tmp_path / 'data' / 'toy.jsonl'}" in err
    assert not (tmp_path / "run" / "sft").exists()

    code, err = memrl_in_process(["run", recipe], stdout=True)
    assert code == 0, err
    written = json.loads((tmp_path / "run" / "sft" / "final" / "toy.json").read_text())
    assert written == {"base": "toy-base-0.5b", "data": str(tmp_path / "data"), "lr": 0.5}

    (tmp_path / "data" / "toy.jsonl").write_text("")  # the data files it declares are checked before it starts
    recipe.write_text(yaml.safe_dump(_recipe(tmp_path, "toy") | {"output_dir": str(tmp_path / "again")}))
    code, err = memrl_in_process(["run", recipe], stdout=True)
    assert code != 0 and "toy.jsonl" in err
    assert not (tmp_path / "again" / "sft" / "final").exists()


def test_preflight_checks_what_the_registered_trainer_says_its_processes_need(
    toy: TrainerBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def needs(stage: SFTStage, plan: str) -> Needs:
        assert "toy trainer: toy-base-0.5b" in plan  # the stage's --dry-run text, to read its options from
        return Needs(modules=("json", "toy_trainer_kernel_not_installed"))

    monkeypatch.setitem(registry.BACKENDS, "toy", dataclasses.replace(toy, needs=needs))
    report = preflight(Recipe.model_validate(_recipe(tmp_path, "toy")))
    assert report.problems == [
        "package: toy_trainer_kernel_not_installed does not import (ModuleNotFoundError: No module named "
        "'toy_trainer_kernel_not_installed'); stage sft needs it"
    ]
