"""Hostile input at the limits: inputs that exhaust the stack, memory or patience, paths of the wrong kind,
hostile YAML, absurd numbers and outputs outside the run folder. Each is one `memrl: error:` line naming the input,
exit 2, no traceback, and no hang (a FIFO read would wait for a writer forever: an alarm turns a hang into a
failure).

The CLI runs in-process (`conftest.memrl_in_process`); the commands and their valid inputs are
test_hostile_inputs.py's table, here fed the new kinds of tests/support/hostile.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import memrl_in_process
from support.hostile import DIR_KINDS, DIR_KINDS_2, FILE_KINDS_2, TEXT_KINDS, YAML_KINDS, make
from test_hostile_inputs import SLOTS, Slot, assert_one_line, valid  # noqa: F401 (the fixture: round one's inputs)

from memrl.core.errors import ConfigError, MemrlError

HANG_S = 20  # far above any case here; a FIFO opened for reading blocks for ever


class Hung(Exception):
    pass


@contextlib.contextmanager
def no_hang(seconds: int = HANG_S) -> Iterator[None]:
    """Raise `Hung` in this (main) thread if the body runs longer than `seconds`: a blocked open() is interrupted."""

    def ring(signum: int, frame: object) -> None:
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(argv: list[object]) -> tuple[int, str]:
    with no_hang():
        return memrl_in_process(argv)


# ---- every path parameter, against the new kinds of path ---------------------------------------------------------

TEXT_ONLY = {"deep_json", "deep_yaml"}  # a plain-text input may hold brackets: not an error there


def _kinds(slot: Slot) -> tuple[str, ...]:
    if slot.kinds == DIR_KINDS:
        return DIR_KINDS_2
    if slot.kinds == TEXT_KINDS:
        return tuple(k for k in FILE_KINDS_2 if k not in TEXT_ONLY)
    if "missing" in slot.kinds and slot.env is None:  # an input file, or a file or folder
        return FILE_KINDS_2
    return ()  # outputs and ports: round one covers them


CASES = [pytest.param(s, k, id=f"{s.command}:{s.param}:{k}") for s in SLOTS for k in _kinds(s)]


@pytest.mark.parametrize(("slot", "kind"), CASES)
def test_new_hostile_kinds_are_one_line(
    slot: Slot,
    kind: str,
    valid: dict[str, str],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = make(kind, tmp_path)
    names = {**valid, "out": str(tmp_path / "out"), "path": str(path)}
    code, stderr = run([a.format(**names) for a in slot.argv])
    line = assert_one_line(code, stderr)
    assert f"hostile-{kind}" in line, line
    if kind in ("fifo", "chardev"):  # it exists: say what it is, not that it is missing
        assert not any(word in line for word in ("not found", "does not exist", "missing")), line


def test_the_kind_of_a_path_is_named(tmp_path: Path) -> None:
    """A path that exists but is the wrong kind is called what it is, not "not found"."""
    from memrl.core.files import describe_kind, list_dir, read_text

    fifo, dev, dangling = (make(k, tmp_path) for k in ("fifo", "chardev", "broken_link"))
    assert describe_kind(fifo) == "a FIFO (named pipe)"
    assert describe_kind(dev) == "a character device"
    assert describe_kind(dangling) == "a broken symbolic link"
    with no_hang(), pytest.raises(ConfigError, match=rf"^{fifo}: a FIFO \(named pipe\), not a file$"):
        read_text(fifo, ConfigError)
    with pytest.raises(ConfigError, match=rf"^{dev}: a character device, not a folder$"):
        list_dir(dev, ConfigError)


def test_a_fifo_planted_as_a_progress_log_is_refused(tmp_path: Path) -> None:
    from memrl.core.files import ResumableJsonl

    log = tmp_path / "progress.jsonl"
    os.mkfifo(log)
    with no_hang(), pytest.raises(MemrlError, match="a FIFO"):
        ResumableJsonl(log)


@pytest.mark.parametrize("kind", ["fifo", "chardev", "empty_dir"])
def test_resume_names_what_the_run_folder_holds(kind: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if kind != "empty_dir":
        saved = make(kind, tmp_path)
        saved.rename(run_dir / "recipe.resolved.yaml")
    code, stderr = run(["resume", run_dir])
    line = assert_one_line(code, stderr, str(run_dir))
    assert {"fifo": "a FIFO", "chardev": "a character device", "empty_dir": "is missing"}[kind] in line


# ---- recipes: hostile YAML, `extends`, overrides ---------------------------------------------------------------


@pytest.mark.parametrize("kind", YAML_KINDS)
@pytest.mark.parametrize("command", ["recipes show {}", "run {}", "launch {} --ray-address 127.0.0.1:9"])
def test_hostile_yaml_recipe_is_one_line(command: str, kind: str, tmp_path: Path) -> None:
    recipe = make(kind, tmp_path)
    code, stderr = run([part.format(recipe) for part in command.split()])
    why = {
        "yaml_bomb": "expands to more than",
        "yaml_self": "alias refers to a value that contains it",
        "yaml_tag": "tag !!python/object/apply:os.system is not allowed",
        "deep_yaml": "nested more than",
    }[kind]
    assert_one_line(code, stderr, f"hostile-{kind}", why)


@pytest.mark.parametrize(
    "extends",
    ["7", "false", "{base: 1}", "[base, null]", "[base, 3]", '""', "[[base]]", "1.5"],
)
def test_extends_of_the_wrong_type_is_one_line(extends: str, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {extends}\nname: r\n")
    code, stderr = run(["recipes", "show", recipe])
    assert_one_line(code, stderr, str(recipe), "`extends` must be a recipe name")


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("seed=&s {k: *s}", "alias refers to a value that contains it"),
        ("stages.pull.models=[&l [*l]]", "alias refers to a value that contains it"),
        ("name=!!python/object/new:os.system [x]", "is not allowed"),
        ("name=!foo bar", "tag !foo is not allowed"),
        ("seed=" + "[" * 3000 + "]" * 3000, "nested more than"),
        ("description=" + "{a: " * 200 + "1" + "}" * 200, "nested more than"),
        ("stages.pull.models.³=x", "not one of its indices"),
        ("stages.pull.models.٣=x", "not one of its indices"),  # an Arabic-Indic digit: isdigit() but not ASCII
        ("stages.eval.sampling.temperature=-.inf", "stages.eval.sampling.temperature: expected a finite number"),
        ("stages.sft.lr=.NaN", "stages.sft.lr: expected a finite number"),
        ("seed=4294967296", "outside the seed range"),
        ("seed=-3", "outside the seed range"),
        ("stages.data.collab.sampling.agent.seed=1e30", "stages.data.collab.sampling.agent.seed"),
        ("stages.sft.max_steps=123456789012345678901234", "too large"),
        ("stages.data.train_users=3000000000", "stages.data.train_users: 3000000000 is too large"),
        ("stages.grpo.kl_coef=1e308", "too large"),
    ],
)
def test_hostile_override_is_one_line(override: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, stderr = run(["recipes", "show", "quickstart", override])
    assert_one_line(code, stderr, why)


def test_a_billion_laughs_override_is_refused_fast(tmp_path: Path) -> None:
    levels = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    code, stderr = run(["recipes", "show", "quickstart", f"description=[{', '.join(levels)}]"])
    assert_one_line(code, stderr, "expands to more than")


def test_aliases_and_merge_keys_still_work(tmp_path: Path) -> None:
    """Bounded, not banned: a recipe may share a section through an anchor and a merge key."""
    recipe = tmp_path / "shared.yaml"
    recipe.write_text(
        textwrap.dedent("""\
        extends: generate
        name: &name shared
        description: *name
        stages:
          generate:
            sampling: &s {temperature: 0.0, max_tokens: 8}
        """)
    )
    assert run(["recipes", "show", recipe, "description=&d short"]) == (0, "")
    from memrl.core.yamlsafe import safe_load

    data = safe_load("base: &b {t: 0.0, n: 8}\nuse: {<<: *b, n: 4}\nlist: [*b, *b]\n")
    assert data["use"] == {"t": 0.0, "n": 4} and data["list"] == [{"t": 0.0, "n": 8}] * 2


# ---- numbers on the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flag", "why"),
    [
        (["chat", "hi", "--endpoint", "http://127.0.0.1:9/v1", "--timeout", "nan"], "--timeout", ""),
        (["chat", "hi", "--temperature", "inf"], "--temperature", "not a finite number"),
        (["chat", "hi", "--seed", "4294967296"], "--seed", "outside the seed range"),
        (["chat", "hi", "--max-tokens", "99999999999"], "--max-tokens", "too large"),
        (["chat", "hi", "--endpoint", "http://127.0.0.1:9/v1", "--retries", "1000000"], "--retries", "100"),
        (["reward", "score", "--reflection-file", "{text}", "--enforcements-file", "{text}", "--format-weight",
          "-inf"], "--format-weight", "not a finite number"),
        (["eval", "collab", "--out", "{out}", "--judge", "j@http://127.0.0.1:9/v1", "--request-timeout", "inf"],
         "--request-timeout", "not a finite number"),
        (["eval", "collab", "--out", "{out}", "--user-max-tokens", "1e3"], "--user-max-tokens", "integer"),
        (["eval", "collab", "--out", "{out}", "--seed", "18446744073709551616"], "--seed", "seed range"),
        (["eval", "tod", "--data", "{mstod}", "--reader", "template", "--out", "{out}", "--top-k", "5000000000"],
         "--top-k", "too large"),
        (["eval", "tod", "--data", "{mstod}", "--reader", "template", "--out", "{out}", "--alpha", "nan"],
         "--alpha", "not a finite number"),
        (["data", "tod", "--sgd-dir", "{sgd}", "--individuals", "9999999999", "--out", "{out}"],
         "--individuals", "too large"),
        (["eval", "reflector", "--model", "smollm2", "--data", "{reflection}", "--out", "{out}", "--max-tokens",
          "4294967296"], "--max-tokens", "too large"),
    ],
)  # fmt: skip
def test_absurd_numbers_are_one_line(
    argv: list[str],
    flag: str,
    why: str,
    valid: dict[str, str],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    names = {**valid, "out": str(tmp_path / "out")}
    code, stderr = run([a.format(**names) for a in argv])
    assert_one_line(code, stderr, flag, why)
    assert not (tmp_path / "out").exists()


def test_a_client_flag_is_validated_by_its_config() -> None:
    """`--request-timeout` reaches OpenAIModelConfig by assignment, which is validated (no unchecked model_copy)."""
    from pydantic import ValidationError

    from memrl.app.cli.from_config import client_flags
    from memrl.rollout.config import OpenAIModelConfig

    spec = {"judge": OpenAIModelConfig(backend="openai", model="m", endpoint="http://127.0.0.1:9/v1")}
    timeout = next(f for f in client_flags(["judge"]) if f.name == "request_timeout")
    with pytest.raises(ValidationError, match="finite"):
        timeout.apply(spec, float("inf"), OpenAIModelConfig)


# ---- stage outputs, models, disk full ----------------------------------------------------------------------------


@pytest.mark.parametrize("output", ["../../../escaped.jsonl", "", "/tmp/abs.jsonl", "..", "sub/dir.jsonl"])
def test_a_stage_output_stays_in_its_folder(output: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, stderr = run(["run", "generate", f"stages.generate.output={output}", "--dry-run"])
    assert_one_line(code, stderr, "stages.generate.output", "file name inside the stage's folder")
    assert not list(tmp_path.rglob("*.jsonl"))


@pytest.mark.parametrize("kind", ["empty_dir", "fifo", "file_dir"])
def test_a_model_folder_without_a_model_is_one_line(kind: str, tmp_path: Path) -> None:
    if kind == "file_dir":
        folder = tmp_path / "weights"
        folder.mkdir()
        (folder / "README.md").write_text("no model here\n")
    else:
        folder = make(kind, tmp_path)
    code, stderr = run(["chat", "hi", "--model", folder])
    line = assert_one_line(code, stderr, str(folder))
    assert ("a FIFO" if kind == "fifo" else "no model files (config.json") in line


def _with_file_size_limit(code: str, limit: int, tmp_path: Path, env: dict[str, str] | None = None) -> str:
    """Run `code` in a fresh interpreter whose files cannot grow past `limit` bytes (EFBIG, as on a full disk)."""
    prelude = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, **(env or {})},
    )  # fmt: skip
    return done.stdout + done.stderr


def test_a_full_disk_names_the_file_being_written(tmp_path: Path) -> None:
    out = _with_file_size_limit(
        """
        from memrl.core.files import atomic_write_text, describe_os_error
        from memrl.core.files import ResumableJsonl
        for write in (lambda: atomic_write_text("big.json", "x" * 100_000),
                      lambda: ResumableJsonl(__import__("pathlib").Path("log.jsonl")).append({"key": "x" * 100_000})):
            try:
                write()
            except OSError as exc:
                print(describe_os_error(exc))
        """,
        4096,
        tmp_path,
    )
    assert out.splitlines() == [
        "big.json: file too large (a size limit of the file system or the process)",
        "log.jsonl: file too large (a size limit of the file system or the process)",
    ], out
    assert not (tmp_path / ".big.json.tmp").exists() and not (tmp_path / "big.json").exists()


@pytest.mark.parametrize("kind", ["safetensors", "oserror"])
def test_a_full_disk_while_pulling_a_model_is_one_line(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion that runs out of disk: safetensors reports it in its own exception type, as text."""
    from safetensors import SafetensorError

    from memrl.core import models

    def prepare(out: Path) -> None:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        if kind == "safetensors":
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        raise OSError(errno.ENOSPC, "No space left on device")  # a write names no file

    fake = models.EmbeddedModel("full-disk", "chat", "a model whose conversion fills the disk", prepare)
    monkeypatch.setitem(models.REGISTRY, fake.name, fake)
    monkeypatch.setitem(models._BY_ALIAS, fake.name, fake)
    monkeypatch.setenv("MEMRL_CACHE", str(tmp_path))
    code, stderr = run(["models", "pull", "full-disk"])
    target = tmp_path / "models" / "full-disk"
    assert_one_line(code, stderr, f"{target}: cannot write model full-disk: no space left on the device")
    assert os.listdir(tmp_path / "models") == []  # nothing half-built left behind
