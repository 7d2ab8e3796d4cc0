"""The dataset builders' config models (data_gen/config.py): what they refuse, and `generate`'s prompt reading."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from memrl.core.errors import ConfigError
from memrl.data_gen.config import GenerateConfig, JudgerDataConfig, ReflectionDataConfig, TodDataConfig
from memrl.data_gen.generate import read_prompts


def test_judger_data_takes_one_way_to_hold_out_individuals(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="give eval_individuals or eval_fraction, not both"):
        JudgerDataConfig(tod_dir=tmp_path, eval_individuals=2, eval_fraction=0.5)
    assert JudgerDataConfig(tod_dir=tmp_path, eval_fraction=0.5).eval_individuals is None


def test_reflection_data_takes_both_session_lists_or_neither(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="give both `train_sessions` and `eval_sessions`"):
        ReflectionDataConfig(train_sessions=[tmp_path / "a.jsonl"])


def test_tod_data_refuses_an_unknown_memory_source(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="memory"):
        TodDataConfig(sgd_dir=tmp_path, individuals=2, memory="oracle")  # type: ignore[arg-type]


def test_generate_reads_inline_prompts_then_the_file_skipping_blank_lines(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "b"}\n\n{"prompt": "c", "id": 3}\n')
    text = tmp_path / "p.txt"
    text.write_text("d\n\ne\n")
    assert read_prompts(GenerateConfig(model="m", prompts=["a"], prompts_file=jsonl)) == ["a", "b", "c"]
    assert read_prompts(GenerateConfig(model="m", prompts_file=text)) == ["d", "e"]
    with pytest.raises(ValidationError, match="give `prompts` or `prompts_file`"):
        GenerateConfig(model="m")


def test_generate_names_the_line_without_a_prompt(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "b"}\n{"text": "c"}\n')
    with pytest.raises(
        ConfigError, match=r"p\.jsonl:2: expected a JSON object with a 'prompt' string, got no 'prompt' field"
    ):
        read_prompts(GenerateConfig(model="m", prompts_file=jsonl))
