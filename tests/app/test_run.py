"""`memrl run`: stages in order, resolved recipe beside the outputs, resumable generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import MemrlCLI


def rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_generate_on_smollm2(smollm2: str, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    result = memrl_cli("run", "generate", f"output_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = rows(tmp_path / "generate" / "generations.jsonl")
    assert len(out) == 2 and all(len(str(r["completion"]).split()) >= 3 for r in out)
    saved = yaml.safe_load((tmp_path / "recipe.resolved.yaml").read_text())
    assert saved["stages"]["generate"]["sampling"]["max_tokens"] == 48
    assert saved["models"]["policy"]["model"] == "smollm2-135m-instruct"


@pytest.mark.slow
def test_rerun_resumes_without_duplicates(tiny_qwen2: str, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(5)))
    args = (
        "generate",
        "models.policy.model=tiny-qwen2",
        "stages.pull.models=[tiny-qwen2]",
        "stages.generate.prompts=[]",
        f"stages.generate.prompts_file={prompts}",
        "stages.generate.sampling.max_tokens=4",
        f"output_dir={tmp_path / 'run'}",
    )
    assert memrl_cli("run", *args, cwd=tmp_path).returncode == 0
    out = tmp_path / "run" / "generate" / "generations.jsonl"
    first = rows(out)
    assert [r["prompt"] for r in first] == [f"question {i}" for i in range(5)]

    # A killed run leaves a torn last line; the rerun drops it and redoes only that prompt.
    text = out.read_text().splitlines(keepends=True)
    out.write_text("".join(text[:3]) + text[3][:10])
    result = memrl_cli("run", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    again = rows(out)
    assert sorted(str(r["prompt"]) for r in again) == [f"question {i}" for i in range(5)]
    assert again[:3] == first[:3]

    # New prompts only add rows.
    prompts.write_text(prompts.read_text() + json.dumps({"prompt": "question 5"}) + "\n")
    assert memrl_cli("run", *args, cwd=tmp_path).returncode == 0
    assert len(rows(out)) == 6


def test_bad_prompts_file_is_one_line(tiny_qwen2: str, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    result = memrl_cli(
        "run",
        "generate",
        "models.policy.model=tiny-qwen2",
        "--stage",
        "generate",
        f"stages.generate.prompts_file={prompts}",
        f"output_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"memrl: error: {prompts}:2: expected a JSON object with a 'prompt' string, got no 'prompt' field"
    )
