"""tools/datum_walk.py counts a memrl module only when its functions ran, in every process a stage starts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "datum_walk.py"


def _tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("datum_walk", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tracer_records_modules_whose_code_ran_in_a_process_and_its_children(tmp_path: Path) -> None:
    walk = _tool()
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "sitecustomize.py").write_text(walk.TRACER)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, walk.ENV_OUT: str(out), "PYTHONPATH": str(tmp_path / "trace"), "OMP_NUM_THREADS": "1"}
    child = "import memrl.core.stats as s; s.mean_interval([1.0, 2.0, 3.0])"
    # A module body (here one named memrl.probe) that calls a function while it is imported: import, not work.
    body = "import memrl.core.stats as s\nTABLE = s.mean_interval([1.0, 2.0])"
    parent = (
        "import subprocess, sys, types, memrl.core.files, memrl.core.stats; "
        "memrl.core.files.loads('{}'); "
        f"exec(compile({body!r}, 'probe.py', 'exec'), types.ModuleType('memrl.probe').__dict__); "
        f"subprocess.run([sys.executable, '-c', {child!r}], check=True)"
    )
    subprocess.run([sys.executable, "-c", parent], env=env, check=True, timeout=120)

    traced = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    assert len(traced) == 2  # the parent and its child each wrote what ran in it
    ran = set().union(*traced)
    assert {"memrl.core.files", "memrl.core.stats"} <= ran
    parent_only = next(t for t in traced if "memrl.core.files" in t)
    assert "memrl.core.stats" not in parent_only  # imported there and called only by a module body: not counted


def test_the_table_lists_each_stage_and_counts_distinct_modules() -> None:
    walked = {"shared by every stage": ["memrl.app.recipe"], "data": ["memrl.envs.driver", "memrl.rollout.hf_local"]}
    lines = _tool().table(walked).splitlines()
    assert lines[2] == "| shared by every stage | 1 | `app.recipe` |"
    assert lines[3] == "| data | 2 | `envs.driver`, `rollout.hf_local` |"
    assert lines[-1] == "| all stages | 3 | |"
