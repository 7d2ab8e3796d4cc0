"""Nothing dropped or re-split silently: PAHF scenarios without a gold are named, a MultiSessionCollab release cache
keeps its own train/eval split unless asked to re-split, and `--profiles` is split like the problems."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from support import FIXTURES, MemrlCLI

from memrl.core.errors import ConfigError
from memrl.envs.collab.config import CollabEvalConfig
from memrl.envs.collab.problems import load_problems, problems_for
from memrl.envs.collab.profiles import UserProfile, profiles_for, sample_profiles, save_profiles, split_profiles
from memrl.envs.pahf.config import PahfEvalConfig
from memrl.envs.pahf.protocol import LeftOut, plan_jobs

NO_GOLD = FIXTURES / "pahf_no_gold"  # fixtures/pahf's embodied set plus two hand-written scenarios without a gold
RELEASE = FIXTURES / "collab_release"  # <task>/{trainset,testset}_size4_seed42.json, as the release caches them


# --- PAHF: scenarios without a derivable gold ---------------------------------------------------------------------


def _plan(**overrides: object) -> tuple[dict[str, list], LeftOut]:
    left_out = LeftOut()
    cfg = PahfEvalConfig.model_validate({"domain": "embodied", "data": NO_GOLD, **overrides})
    return plan_jobs(cfg, left_out), left_out


def test_pahf_scenarios_without_gold_are_counted_and_named() -> None:
    plan, left_out = _plan()
    named = [(s["phase"], s["file"], s["index"], s["user"], s["reason"]) for s in left_out.scenarios]
    assert named == [
        (1, "original_scenarios_A.json", 6, "Rowan", "empty object list"),
        (1, "original_scenarios_A.json", 5, "Juno", "intended object 'large mug of cocoa' not in the scene"),
        (1, "original_scenarios_A.json", 7, "Juno", "intended object 'slice of lemon cake' not in the scene"),
        (2, "original_scenarios_B.json", 6, "Rowan", "intended place 'pantry shelf' not among the 4 places offered"),
        (3, "evolved_scenarios_A.json", 5, "Juno", "intended object 'large mug of cocoa' not in the scene"),
    ]
    planned = {(job.phase, job.user, job.scenario["index"]) for jobs in plan.values() for job in jobs}
    assert not planned & {(phase, user, index) for phase, _, index, user, _ in named}
    line = left_out.line()
    assert line is not None and "\n" not in line
    assert line.startswith(
        "5 scenario(s) without a derivable gold left out: phase 1 Rowan original_scenarios_A.json[6]"
    )
    assert "and 2 more" in line and "problems.skipped_no_gold" in line
    summary = left_out.summary()["skipped_no_gold"]
    assert summary["count"] == 5 and summary["scenarios"] == left_out.scenarios
    json.dumps(summary)  # goes to metrics.json as it is


def test_pahf_only_scenarios_the_plan_would_reach_are_reported() -> None:
    # Rowan's empty scene is his second row: a one-scenario plan never reaches it, a two-scenario plan skips it.
    assert _plan(scenarios=1)[1].scenarios == []
    plan, left_out = _plan(scenarios=2, users=1)
    assert [(s["user"], s["index"]) for s in left_out.scenarios] == [("Rowan", 6)]
    phase1 = [job.scenario["index"] for job in plan["Rowan"] if job.phase == 1]
    assert phase1 == [0, 1]  # the next scorable scenario takes its place


def test_pahf_shopping_leaves_nothing_out() -> None:
    left_out = LeftOut()
    plan_jobs(PahfEvalConfig(domain="shopping", data=FIXTURES / "pahf"), left_out)
    assert left_out.scenarios == [] and left_out.line() is None


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")  # join the session's Ray head: no Ray start-up per run
def test_eval_pahf_prints_and_saves_what_it_left_out(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "emb"
    result = memrl_cli(
        "eval", "pahf", "--domain", "embodied", "--agent", "none", "--data", NO_GOLD, "--users", "1",
        "--scenarios", "2", "--model", "tiny-qwen2", "--max-tokens", "8", "--workers", "1", "--out", out,
        env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 scenario(s) without a derivable gold left out: phase 1 Rowan original_scenarios_A.json[6]" in (
        result.stderr + result.stdout
    )
    metrics = json.loads((out / "metrics.json").read_text())
    skipped = metrics["problems"]["skipped_no_gold"]
    assert skipped["count"] == 1 and skipped["scenarios"][0]["reason"] == "empty object list"
    assert metrics["tasks"]["planned"] == metrics["tasks"]["finished"] == 8


# --- MultiSessionCollab: the release's own problem split ----------------------------------------------------------


def _questions(split: str, **kw: object) -> list[str]:
    return [p.question for p in problems_for("math-500", RELEASE, split, eval_problems=100, seed=0, **kw)]  # type: ignore[arg-type]


def _file(name: str) -> list[str]:
    return [r["problem"] for r in json.loads((RELEASE / "math-500" / name).read_text())]


def test_release_cache_keeps_its_split_by_default() -> None:
    # The original evaluates every user on the whole testset and never on a trainset problem.
    assert _questions("eval") == _file("testset_size4_seed42.json")
    assert _questions("train") == _file("trainset_size4_seed42.json")
    assert _questions("eval") == [p.question for p in problems_for("math-500", RELEASE / "math-500", "eval",
                                                                    eval_problems=1, seed=9)]  # fmt: skip


def test_resplit_merges_and_holds_out_eval_problems_again() -> None:
    train = problems_for("math-500", RELEASE, "train", eval_problems=3, seed=0, resplit=True)
    evaluation = problems_for("math-500", RELEASE, "eval", eval_problems=3, seed=0, resplit=True)
    assert len(evaluation) == 3 and len(train) == 5
    assert {p.id for p in train + evaluation} == {p.id for p in load_problems("math-500", RELEASE)}
    assert not {p.id for p in train} & {p.id for p in evaluation}


def test_a_single_file_is_split_as_before() -> None:
    path = RELEASE / "math-500" / "testset_size4_seed42.json"
    evaluation = problems_for("math-500", path, "eval", eval_problems=100, seed=0)
    assert len(evaluation) == 2  # at most half held out


def _copy_release(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    shutil.copytree(RELEASE, root)
    return root


def test_a_cache_that_cannot_keep_its_split_says_so_in_one_line(tmp_path: Path) -> None:
    root = _copy_release(tmp_path)
    stray = root / "math-500" / "extra.json"
    stray.write_text((root / "math-500" / "testset_size4_seed42.json").read_text())
    with pytest.raises(ConfigError, match="neither a trainset nor a testset file") as err:
        problems_for("math-500", root, "eval", eval_problems=2, seed=0)
    assert "\n" not in str(err.value) and str(stray) in str(err.value) and "--resplit" in str(err.value)
    stray.unlink()

    (root / "math-500" / "testset_size4_seed42.json").unlink()
    with pytest.raises(ConfigError, match=r"no testset files of task 'math-500' for the eval split.*--resplit"):
        problems_for("math-500", root, "eval", eval_problems=2, seed=0)
    assert len(problems_for("math-500", root, "train", eval_problems=2, seed=0)) == 4


def test_a_release_split_that_overlaps_is_refused(tmp_path: Path) -> None:
    root = _copy_release(tmp_path)
    train = json.loads((root / "math-500" / "trainset_size4_seed42.json").read_text())
    test = json.loads((root / "math-500" / "testset_size4_seed42.json").read_text())
    (root / "math-500" / "trainset_size4_seed42.json").write_text(json.dumps([*train, test[0]]))
    with pytest.raises(ConfigError, match="train and eval problems overlap: 1 eval problem"):
        problems_for("math-500", root, "train", eval_problems=2, seed=0)


# --- MultiSessionCollab: --profiles follows --split ---------------------------------------------------------------


def _profile_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / f"profiles{n}.jsonl"
    save_profiles(sample_profiles(n, seed=5, prefix="p"), path)
    return path


def test_profile_file_is_split_into_disjoint_halves(tmp_path: Path) -> None:
    path = _profile_file(tmp_path, 10)
    train = profiles_for(path, "train", users=5, seed=0)
    evaluation = profiles_for(path, "eval", users=5, seed=0)
    assert {p.id for p in train}.isdisjoint({p.id for p in evaluation})
    assert len({p.id for p in train + evaluation}) == 10
    assert profiles_for(path, "eval", users=2, seed=0) == evaluation[:2]
    assert profiles_for(path, "eval", users=5, seed=1) != evaluation  # the seed draws the halves


def test_profile_split_refuses_what_it_cannot_give(tmp_path: Path) -> None:
    path = _profile_file(tmp_path, 6)
    with pytest.raises(ConfigError, match=r"--users 4: the eval half of .* has 3 users"):
        profiles_for(path, "eval", users=4, seed=0)
    with pytest.raises(ConfigError, match="1 user profile\\(s\\); disjoint train and eval users need at least 2"):
        profiles_for(_profile_file(tmp_path, 1), "train", users=1, seed=0)


def test_sampled_users_keep_their_split() -> None:
    # No file: the same 200 sampled users and halves as before, so earlier runs' users do not change.
    train, evaluation = split_profiles(sample_profiles(200, 3), 100, 3)
    assert profiles_for(None, "eval", users=4, seed=3) == evaluation[:4]
    assert profiles_for(None, "train", users=4, seed=3) == train[:4]


def test_the_runner_selects_by_split(tmp_path: Path) -> None:
    """`eval collab` and the RL rows take their users and problems from the helpers above."""
    from memrl.envs.collab.runner import select_problems, select_profiles

    path = _profile_file(tmp_path, 8)
    cfg = CollabEvalConfig(task="math-500", problems=RELEASE, profiles=path, users=4, split="eval")
    users: dict[str, list[UserProfile]] = {}
    for split in ("train", "eval"):
        users[split] = select_profiles(cfg.model_copy(update={"split": split}))
    assert {p.id for p in users["train"]}.isdisjoint({p.id for p in users["eval"]})
    assert [p.question for p in select_problems(cfg)] == _file("testset_size4_seed42.json")
    resplit = select_problems(cfg.model_copy(update={"resplit": True, "eval_problems": 3}))
    assert len(resplit) == 3
