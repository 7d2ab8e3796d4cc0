"""Fault: training is killed. `memrl resume RUN_DIR` continues from the last checkpoint with the same data order.

The TRL stages are killed for real (SIGKILL once the first checkpoint is on disk) and resumed in a new process; the
resumed run's per-step losses must match an uninterrupted run with the same seed. verl needs GPUs: on CPU the test
checks that the command a resumed verl stage gets points verl's own resume logic at the stage's checkpoints and fixes
the shuffle seed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support import MEMRL_ARGV, MemrlCLI

from memrl.core.checkpoints import last_step_dir, read_info

STEPS = {"sft": 12, "grpo": 6}
SAVE = {"sft": 3, "grpo": 2}


@pytest.fixture(scope="module")
def reflection_data(smoke_run: Path) -> Path:
    """The smoke run's small reflection dataset (read only)."""
    return smoke_run / "data"


def stage_args(kind: str, run: Path, data: Path) -> list[str]:
    common = [
        f"stages.{kind}.data={data}",
        f"stages.{kind}.max_steps={STEPS[kind]}",
        f"stages.{kind}.checkpoints.save_steps={SAVE[kind]}",
        f"stages.{kind}.checkpoints.logging_steps=1",
        # every checkpoint stays (the default keeps the newest 2), so the one a resume starts from can be checked after
        f"stages.{kind}.checkpoints.keep={STEPS[kind] // SAVE[kind]}",
    ]
    extra = ["stages.grpo.init=null"] if kind == "grpo" else []  # start from the base model, no SFT stage needed
    return ["run", "quickstart", "--smoke", "--stage", kind, f"output_dir={run}", *common, *extra]


def checkpoint_saved(stage_dir: Path) -> bool:
    """A checkpoint whose trainer_state.json (written last by the Trainer) is complete."""
    for state in stage_dir.glob("checkpoint-*/trainer_state.json"):
        try:
            json.loads(state.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        return True
    return False


def run_and_kill(args: list[str], cwd: Path, stage_dir: Path, timeout: float = 600) -> str:
    """Start `memrl ARGS`, SIGKILL it as soon as a checkpoint is saved; returns its output."""
    log = cwd / "killed.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*MEMRL_ARGV, *args], cwd=cwd, stdout=out, stderr=out)
        deadline = time.monotonic() + timeout
        try:
            while not checkpoint_saved(stage_dir):
                assert proc.poll() is None, (
                    f"exited ({proc.returncode}) before its first checkpoint:\n" + (log.read_text()[-3000:])
                )
                assert time.monotonic() < deadline, "no checkpoint in time"
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return log.read_text()


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def tokens(history: list[dict[str, Any]]) -> dict[int, float]:
    return {int(row["step"]): float(row["num_tokens"]) for row in history if "num_tokens" in row}


def step_tokens(history: list[dict[str, Any]]) -> dict[int, float]:
    """Tokens trained on at each step (the log keeps a running total)."""
    total = tokens(history)
    return {step: count - total.get(step - 1, 0.0) for step, count in total.items()}


def losses(history: list[dict[str, Any]]) -> dict[int, float]:
    return {int(row["step"]): float(row["loss"]) for row in history if "loss" in row}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sft", "grpo"])
def test_killed_trl_stage_resumes_with_the_same_data_order(
    kind: str, reflection_data: Path, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    steps = STEPS[kind]
    # The reference: the same stage, same seed, never interrupted.
    full = tmp_path / "full"
    full.mkdir()
    result = memrl_cli(*stage_args(kind, full, reflection_data), cwd=full)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = json.loads((full / kind / "log_history.json").read_text())
    assert sorted(losses(reference)) == list(range(1, steps + 1))

    run = tmp_path / "killed"
    run.mkdir()
    run_and_kill(stage_args(kind, run, reflection_data), run, run / kind)
    stage_dir = run / kind
    assert not (stage_dir / "final").exists()  # it really died mid-way
    last = last_step_dir(stage_dir)
    assert last is not None
    at_kill = int(last.name.removeprefix("checkpoint-"))
    assert 0 < at_kill < steps
    saved_state = (last / "trainer_state.json").read_text()

    # Resume from another folder: the run folder alone says what to run and where.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = memrl_cli("resume", str(run), "--stage", kind, cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # (a) it continued from the checkpoint it found, which it left untouched, and ran only the remaining steps
    assert squeeze(f"resuming from {last}") in squeeze(resumed.stderr)  # the console wraps long lines
    assert (last / "trainer_state.json").read_text() == saved_state
    state = json.loads((stage_dir / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    assert state["global_step"] == steps
    history = json.loads((stage_dir / "log_history.json").read_text())
    assert [row["step"] for row in history if "loss" in row] == list(range(1, steps + 1))  # no step trained twice
    assert history[: len(json.loads(saved_state)["log_history"])] == json.loads(saved_state)["log_history"]
    assert not (elsewhere / "runs").exists()  # nothing landed in the caller's folder
    # (b) same data order: every step after the checkpoint has the uninterrupted run's loss. On CPUs with bf16
    # instructions the stages train under bf16 autocast, and the resumed process drifts from the reference by a
    # little more with every step (0.002 to 0.006 after one step depending on the CPU, 0.076 after six, measured at
    # loss ~9.5), so the bound widens with the distance from the checkpoint; the token counts below pin the order.
    got, want = losses(history), losses(reference)
    for step in range(at_kill + 1, steps + 1):
        assert got[step] == pytest.approx(want[step], abs=0.025 * (step - at_kill)), (step, got, want)
    # ... and the ordered samples match exactly: the tokens each step trained on (its batch's fingerprint)
    got_tokens, want_tokens = step_tokens(history), step_tokens(reference)
    for step in range(at_kill + 2, steps + 1):
        assert got_tokens[step] == want_tokens[step], (step, got_tokens, want_tokens)
    first = at_kill + 1  # TRL's SFT restarts its running token count at 0 on resume; GRPO's continues
    assert want_tokens[first] in (got_tokens[first], tokens(history)[first])
    # (c) final/ is complete
    info = read_info(stage_dir / "final")
    assert info is not None and info.steps == steps and info.adapter
    assert (stage_dir / "final" / "adapter_model.safetensors").is_file()
    assert (stage_dir / "final" / "tokenizer_config.json").is_file()


def test_resume_needs_a_run_folder(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    for folder in (tmp_path / "missing", tmp_path):
        result = memrl_cli("resume", str(folder), cwd=tmp_path)
        assert result.returncode == 2
        assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("memrl: error: ")
    (tmp_path / "recipe.resolved.yaml").write_text("stages: [not, a, mapping\n")
    result = memrl_cli("resume", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "malformed YAML" in result.stderr
    assert result.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_resume_reruns_the_saved_recipe_and_skips_finished_stages(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """The saved recipe is the source of truth: a dry run shows the saved overrides, unknown stages fail."""
    run = tmp_path / "run"
    from memrl.app.recipe import load_recipe

    loaded = load_recipe("reflector-qwen2.5-7b", ["seed=7", "stages.grpo.max_steps=3", f"output_dir={run}"])
    loaded.save(run)
    result = memrl_cli("resume", str(run), "--stage", "grpo", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout + result.stderr
    assert "trainer.total_training_steps=3" in out and "data.seed=7" in out
    assert f"trainer.default_local_dir={run / 'grpo' / 'checkpoints'}" in out
    bad = memrl_cli("resume", str(run), "--stage", "nope", cwd=tmp_path)
    assert bad.returncode == 2 and "no stage named 'nope'" in bad.stderr


# --- verl (GPU only): the command a resumed stage gets ------------------------------------------------------------


def _fake_verl_checkpoint(stage_dir: Path, step: int) -> Path:
    """What verl leaves after `step` steps: global_step_N/ and the tracker file its resume logic reads."""
    root = stage_dir / "checkpoints"
    (root / f"global_step_{step}" / "actor").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return root / f"global_step_{step}"


@pytest.mark.parametrize("kind", ["grpo", "sft"])
def test_verl_stage_with_checkpoints_resumes_them_with_a_fixed_shuffle_seed(kind: str, tmp_path: Path) -> None:
    from rich.console import Console
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    from memrl.app.recipe import load_recipe
    from memrl.app.stages.training import verl_command
    from memrl.train.verl.validate import PPO_CONFIG, SFT_CONFIG, compose

    run = tmp_path / "run"
    loaded = load_recipe("reflector-qwen2.5-7b", ["seed=11", f"output_dir={run}"])
    step_dir = _fake_verl_checkpoint(run / kind, 40)
    ctx = loaded.recipe.context(run, Console(stderr=True))
    argv = verl_command(loaded.recipe.stages[kind], ctx, kind, dry_run=True).argv
    overrides = [arg for arg in argv if "=" in arg and not arg.startswith("--")]
    config = PPO_CONFIG if kind == "grpo" else SFT_CONFIG
    cfg = compose(config, overrides)  # what verl's @hydra.main builds from the command
    assert cfg.trainer.resume_mode == "auto"
    assert Path(cfg.trainer.default_local_dir) == run / kind / "checkpoints"
    # verl's own lookup (what `resume_mode=auto` runs) finds the checkpoint the killed run left behind
    assert find_latest_ckpt_path(cfg.trainer.default_local_dir) == str(step_dir)
    if kind == "grpo":
        assert cfg.data.shuffle and cfg.data.seed == 11  # verl's default null seeds the sampler from the clock
    else:
        # verl's SFT trainer shuffles with DistributedSampler's fixed default seed (0): nothing to pin
        assert not any(arg.startswith("data.seed=") for arg in overrides)
