"""Readers under hostile input: nesting past the stack, FIFOs and hostile YAML in override values are one
ConfigError naming the input, never a RecursionError, a hang or an unbounded alias expansion."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from test_hostile_limits import no_hang

from memrl.core.errors import ConfigError

DEEP = "[" * 100_000 + "]" * 100_000  # far past Python's recursion limit


def _deep(path: Path) -> Path:
    path.write_text(DEEP + "\n")
    return path


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_problem_files_nested_too_deeply_are_one_error(suffix: str, tmp_path: Path) -> None:
    from memrl.envs.collab.problems import _read_records

    path = _deep(tmp_path / f"problems{suffix}")
    with pytest.raises(ConfigError, match=rf"^{path}(:1)?: not valid JSON \(nested too deeply"):
        _read_records(path)


@pytest.mark.parametrize("suffix", [".json", ".parquet"])
def test_a_fifo_as_a_problem_file_is_named_not_read(suffix: str, tmp_path: Path) -> None:
    from memrl.envs.collab.problems import _read_records

    fifo = tmp_path / f"problems{suffix}"
    os.mkfifo(fifo)
    with no_hang(), pytest.raises(ConfigError, match=rf"^{fifo}: a FIFO \(named pipe\), not a file$"):
        _read_records(fifo)


def test_eval_rows_and_judger_pairs_nested_too_deeply(tmp_path: Path) -> None:
    from memrl.data_gen.judger_pairs import read_pairs
    from memrl.train.evaluate import load_eval_split

    path = _deep(tmp_path / "eval.jsonl")
    for read in (lambda: load_eval_split(path, None), lambda: read_pairs(path)):
        with pytest.raises(ConfigError, match=rf"^{path}:1: not valid JSON \(nested too deeply\)$"):
            read()


LAUGHS = ["&a0 [x, x, x, x, x, x, x, x, x]", *(f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9))]
BOMB = f"[{', '.join(LAUGHS)}]"  # ~600 bytes, 9^9 values once expanded


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("&s [*s]", "alias refers to a value that contains it"),
        (BOMB, "expands to more than"),
        ("!!python/name:os.system", "is not allowed"),
        ("[1, 2", "malformed YAML"),
    ],
)
def test_training_overrides_read_their_values_as_bounded_yaml(value: str, why: str) -> None:
    from memrl.train.hf_trainer import apply_overrides
    from memrl.train.llamafactory.backend import apply_overrides as lf_overrides

    @dataclasses.dataclass
    class Args:
        learning_rate: float = 1e-5

    item = f"learning_rate={value}"
    with pytest.raises(ConfigError, match=rf"^stages\.sft\.overrides: .*{why}"):
        apply_overrides(Args, {}, [item], "sft")
    with pytest.raises(ConfigError, match=rf"^LLaMA-Factory override .*{why}"):
        lf_overrides({}, [item])
    assert apply_overrides(Args, {}, ["learning_rate=0.5"], "sft") == {"learning_rate": 0.5}


def test_eval_tod_names_what_its_paths_are(tmp_path: Path) -> None:
    from memrl.app.actions.tod import _check_inputs
    from memrl.envs.tod.config import TodEvalConfig

    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "schema.json")
    with no_hang(), pytest.raises(ConfigError, match=r"schema\.json: no schema \(a FIFO \(named pipe\)\)"):
        _check_inputs(TodEvalConfig(data=data))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=rf"^--data {fifo}: not a folder \(a FIFO \(named pipe\)\)$"):
        _check_inputs(TodEvalConfig(data=fifo))


def test_the_cli_consoles_mask_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    """What an action prints ("session failed: ... URL") goes through a console that masks every known secret."""
    from rich.console import Console

    from memrl.app.cli import commands, main
    from memrl.core import secrets

    secrets.register(["console-secret-5d2a7c"])
    cells = commands.COMMANDS["eval collab"].__closure__ or ()  # built by `from_config`: its console is in its closure
    action_consoles = [c.cell_contents for c in cells if isinstance(c.cell_contents, Console)]
    for console in [main.console, *action_consoles]:
        console.print("session failed: http://u:console-secret-5d2a7c@h/v1")
    err = capsys.readouterr().err
    assert err.count("http://u:***@h/v1") == 1 + len(action_consoles) == 2, err
