"""Every command that takes a path or a port, against every hostile kind of input it accepts (tests/support/hostile.py):
exit 2, one `memrl: error:` line naming what is wrong, no traceback, and nothing already on disk lost.

The CLI runs in-process (`memrl.app.cli.main.main`): a subprocess per case would cost seconds each. A command with a
path or port parameter that no row below covers (nor EXEMPT explains) fails `test_every_path_parameter_is_covered`.
"""

from __future__ import annotations

import json
import shutil
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from support import FIXTURES, memrl_in_process, pahf_task
from support.hostile import (
    DIR_KINDS,
    FILE_KINDS,
    OUT_KINDS,
    PORT_KINDS,
    READONLY_BLOCKS,
    TEXT_KINDS,
    make,
    restore_permissions,
    snapshot,
)

from memrl.app.cli.main import app

SGD, MSTOD, PAHF = FIXTURES / "sgd", FIXTURES / "mstod", FIXTURES / "pahf"
SHOP = PAHF / "shopping"
BOTH_KINDS = FILE_KINDS + tuple(k for k in DIR_KINDS if k not in FILE_KINDS)  # takes a file or a folder
OUT, CHOICE, TEMPLATE = ("--out", "{out}"), ("--choice", "A"), ("--reader", "template")


@dataclass(frozen=True)
class Slot:
    """One path parameter of one command: `argv` with `{path}` where the hostile path goes (or `env` names the
    variable that takes it), `{out}` a fresh output folder, other `{name}`s the valid inputs of `valid_inputs`."""

    command: str
    param: str
    argv: tuple[str, ...]
    kinds: tuple[str, ...]
    env: str | None = None


def _slot(command: str, param: str, kinds: tuple[str, ...], *argv: str, env: str | None = None) -> Slot:
    return Slot(command, param, (*command.split(), *argv), kinds, env)


SLOTS = [
    _slot("recipes show", "recipe", FILE_KINDS, "{path}"),
    _slot("run", "recipe", FILE_KINDS, "{path}"),
    _slot("run", "output_dir=", OUT_KINDS, "quickstart", "output_dir={path}", "--stage", "pull"),
    _slot("launch", "recipe", FILE_KINDS, "{path}", "--ray-address", "127.0.0.1:9", "--dry-run"),
    _slot("resume", "run_dir", DIR_KINDS, "{path}"),
    _slot("export", "checkpoint", DIR_KINDS, "--checkpoint", "{path}", "--out", "{out}"),
    _slot("export", "out", OUT_KINDS, "--checkpoint", "{tiny}", "--out", "{path}"),
    _slot("env llamafactory", "path", OUT_KINDS, "--path", "{path}"),
    _slot("collab check", "response_file", TEXT_KINDS, "--preference", "direct", "--response-file", "{path}"),
    _slot("collab compare", "memory_dir", DIR_KINDS, "--memory", "{path}", "--baseline", "{collab}", *OUT),
    _slot("collab compare", "baseline_dir", DIR_KINDS, "--memory", "{collab}", "--baseline", "{path}", *OUT),
    _slot("collab compare", "out", OUT_KINDS, "--memory", "{collab}", "--baseline", "{collab}", "--out", "{path}"),
    _slot("pahf feedback", "persona_table", FILE_KINDS, "--persona-table", "{path}", "--scenario", "{row}", *CHOICE),
    _slot("pahf feedback", "scenario", FILE_KINDS, "--persona-table", "{table}", "--scenario", "{path}", *CHOICE),
    _slot("pahf feedback", "original_table", FILE_KINDS,
          "--persona-table", "{table}", "--scenario", "{row}", *CHOICE, "--original-table", "{path}"),
    _slot("eval collab", "out", OUT_KINDS, "--out", "{path}"),
    _slot("eval collab", "problems", BOTH_KINDS, "--out", "{out}", "--problems", "{path}"),
    _slot("eval collab", "profiles", FILE_KINDS, "--out", "{out}", "--profiles", "{path}"),
    _slot("eval reflector", "data", BOTH_KINDS, "--model", "smollm2", "--data", "{path}", "--out", "{out}"),
    _slot("eval reflector", "out", OUT_KINDS, "--model", "smollm2", "--data", "{reflection}", "--out", "{path}"),
    _slot("eval judger", "data", BOTH_KINDS, "--data", "{path}", "--out", "{out}"),
    _slot("eval judger", "model", DIR_KINDS, "--model", "{path}", "--data", "{pairs}", "--out", "{out}"),
    _slot("eval judger", "out", OUT_KINDS, "--data", "{pairs}", "--out", "{path}"),
    _slot("eval tod", "data", DIR_KINDS, "--data", "{path}", *TEMPLATE, *OUT),
    _slot("eval tod", "schema", BOTH_KINDS, "--data", "{mstod}", "--schema", "{path}", *TEMPLATE, *OUT),
    _slot("eval tod", "split_from", DIR_KINDS, "--data", "{mstod}", "--split-from", "{path}", *TEMPLATE, *OUT),
    _slot("eval tod", "judger", DIR_KINDS, "--data", "{mstod}", "--judger", "{path}", *TEMPLATE, *OUT),
    _slot("eval tod", "out", OUT_KINDS, "--data", "{mstod}", *TEMPLATE, "--out", "{path}"),
    _slot("eval pahf", "data", DIR_KINDS, "--domain", "shopping", "--data", "{path}", "--out", "{out}"),
    _slot("eval pahf", "out", OUT_KINDS, "--domain", "shopping", "--data", "{pahf}", "--out", "{path}"),
    _slot("data reflection", "train_sessions", FILE_KINDS,
          "--train-sessions", "{path}", "--eval-sessions", "{sessions}", "--out", "{out}"),
    _slot("data reflection", "eval_sessions", FILE_KINDS,
          "--train-sessions", "{sessions}", "--eval-sessions", "{path}", "--out", "{out}"),
    _slot("data tod", "sgd_dir", DIR_KINDS, "--sgd-dir", "{path}", "--individuals", "1", "--out", "{out}"),
    _slot("data tod", "out", OUT_KINDS, "--sgd-dir", "{sgd}", "--individuals", "1", "--out", "{path}"),
    _slot("data judger", "tod_dir", DIR_KINDS, "--tod-dir", "{path}", "--out", "{out}"),
    _slot("data judger", "schema", BOTH_KINDS, "--tod-dir", "{mstod}", "--schema", "{path}", "--out", "{out}"),
    _slot("data judger", "out", OUT_KINDS, "--tod-dir", "{mstod}", "--out", "{path}"),
    _slot("data pahf", "run", DIR_KINDS, "--run", "{path}", "--out", "{out}"),
    _slot("data pahf", "out", OUT_KINDS, "--run", "{pahf_run}", "--out", "{path}"),
    _slot("reward score", "reflection_file", TEXT_KINDS,
          "--reflection-file", "{path}", "--enforcements-file", "{text}"),
    _slot("reward score", "enforcements_file", TEXT_KINDS,
          "--reflection-file", "{text}", "--enforcements-file", "{path}"),
    _slot("reward score", "gold_file", TEXT_KINDS,
          "--reflection-file", "{text}", "--enforcements-file", "{text}", "--gold-file", "{path}"),
    _slot("models pull", "MEMRL_CACHE", OUT_KINDS, "minilm", env="MEMRL_CACHE"),
    _slot("serve", "port", PORT_KINDS, "--port", "{path}"),
    _slot("world serve collab", "port", PORT_KINDS, "--port", "{path}"),
    _slot("world serve collab", "problems", BOTH_KINDS, "--problems", "{path}"),
    _slot("world serve tod", "port", PORT_KINDS, "--data", "{mstod}", "--port", "{path}"),
    _slot("world serve tod", "data", DIR_KINDS, "--data", "{path}"),
    _slot("world serve pahf", "port", PORT_KINDS, "--data", "{pahf}", "--port", "{path}"),
    _slot("world serve pahf", "data", DIR_KINDS, "--data", "{path}"),
]  # fmt: skip

# Path parameters no row exercises, and why.
EXEMPT = {
    ("data reflection", "out"): "reached only with sessions that teach something (a real collab run); the write "
    "goes through the same mkdir as data tod/judger/pahf's --out",
    ("reward score", "cache_dir"): "only the LLM judge uses it; the offline judge of these rows caches nothing",
}

# Parameters that hold a path although typed str (a recipe is a bundled name or a file; PHASEFILE:INDEX).
STR_PATHS = {("run", "recipe"), ("launch", "recipe"), ("recipes show", "recipe"), ("pahf feedback", "scenario")}


def _commands() -> Iterator[tuple[str, Any]]:
    """(command path, click command) for every leaf command of the app."""

    def walk(cmd: Any, prefix: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield " ".join(prefix), cmd
            return
        for name, sub in subs.items():
            yield from walk(sub, (*prefix, name))

    yield from walk(typer.main.get_command(app), ())


def _is_path(annotation: object) -> bool:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        return any(_is_path(a) for a in typing.get_args(annotation))
    return annotation is Path


def path_parameters() -> set[tuple[str, str]]:
    """(command, parameter) for every parameter typed Path (or list/Optional of it), the str-typed path parameters,
    and every port."""
    found = set()
    for name, cmd in _commands():
        hints = typing.get_type_hints(cmd.callback, include_extras=True)
        for param in cmd.params:
            if _is_path(hints.get(param.name)) or (name, param.name) in STR_PATHS or param.name == "port":
                found.add((name, param.name))
    return found


def test_every_path_parameter_is_covered() -> None:
    covered = {(s.command, s.param) for s in SLOTS} | set(EXEMPT)
    missing = path_parameters() - covered
    assert not missing, f"commands with a path or port parameter the hostile table does not cover: {sorted(missing)}"
    assert len(path_parameters()) > 30  # the walk found the commands (a broken walk must not pass vacuously)


# ---- valid inputs for the parameters a row does not vary ---------------------------------------------------------


def _write_json(path: Path, data: object, lines: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = data if lines else [data]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # type: ignore[union-attr]
    return path


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("valid")
    collab = root / "collab-run"
    _write_json(collab / "metrics.json", {"per_session": [{"session": 0, "task_success": 1.0, "user_effort": 2.0,
                                                           "length": 3.0}]})  # fmt: skip
    tasks = [pahf_task(key=key, user=f"u{n}", product="p", correct=True).to_dict() for n, key in enumerate("ab")]
    pahf_run = root / "pahf-run"
    _write_json(pahf_run / "tasks.jsonl", tasks, True)
    session = {"user_id": "u", "session": 0, "problem_id": "p", "task": "math", "preferences": [], "turns": []}
    sessions = _write_json(root / "sessions.jsonl", session)
    row = {"key": "k", "prompt": [{"role": "user", "content": "hi"}], "ground_truth": {"enforcements": []}}
    reflection = _write_json(root / "reflection" / "rl" / "eval.jsonl", row)
    text = root / "notes.txt"
    text.write_text("Use bullet points.\n")
    pairs = root / "judger-data"
    assert run(["data", "judger", "--tod-dir", MSTOD, "--out", pairs])[0] == 0
    return {
        "collab": str(collab),
        "pahf_run": str(pahf_run),
        "sessions": str(sessions),
        "reflection": str(reflection.parent.parent),
        "text": str(text),
        "pairs": str(pairs),
        "mstod": str(MSTOD),
        "sgd": str(SGD),
        "pahf": str(PAHF),
        "table": str(SHOP / "persona_info.json"),
        "row": f"{SHOP / 'phase1.json'}:0",
    }


run = memrl_in_process  # `memrl ARGV` in this process: (exit code, stderr)


def assert_one_line(code: int, stderr: str, *fragments: str) -> str:
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("memrl: error: ")]
    assert errors == lines[-1:], stderr[-3000:]  # one error line, and the last thing printed
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


CASES = [pytest.param(slot, kind, id=f"{slot.command}:{slot.param}:{kind}") for slot in SLOTS for kind in slot.kinds]


@pytest.mark.parametrize(("slot", "kind"), CASES)
def test_hostile_input_is_one_line(
    slot: Slot,
    kind: str,
    valid: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    if kind == "readonly" and not READONLY_BLOCKS:
        pytest.skip("chmod does not block writes here (root): below_file covers the unwritable location")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # `run` writes runs/<name> below the current folder
    path = make(kind, tmp_path) if kind not in PORT_KINDS else kind
    names = {**valid, "out": str(tmp_path / "out"), "path": str(path)}
    if "{tiny}" in slot.argv:
        names["tiny"] = str(request.getfixturevalue("tiny_qwen2"))
    argv = [a.format(**names) for a in slot.argv]
    if slot.env is not None:
        monkeypatch.setenv(slot.env, str(path))
    before = snapshot(tmp_path)
    try:
        code, stderr = run(argv)
    finally:
        restore_permissions(tmp_path)
    line = assert_one_line(code, stderr)
    shown = "--port" if kind in PORT_KINDS else ("a-file" if kind == "below_file" else f"hostile-{kind}")
    assert shown in line, line  # the line names the path (or the option) that is wrong
    after = snapshot(tmp_path)
    lost = {name for name, data in before.items() if after.get(name) != data}
    assert not lost, f"files changed or lost by a failed command: {sorted(lost)}"


# ---- a resume folder whose progress log is broken ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tod_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tod") / "run"
    assert run(["data", "tod", "--sgd-dir", SGD, "--individuals", "1", "--out", out])[0] == 0
    return out


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param("binary_config", id="binary-config"),
        pytest.param("truncated_config", id="truncated-config"),
        pytest.param("garbage_log_line", id="garbage-log-line"),
        pytest.param("binary_log", id="binary-log"),
    ],
)
def test_broken_resume_folder_is_one_line(damage: str, tod_run: Path, tmp_path: Path) -> None:
    """`memrl data tod` resumes from OUT/.progress; a damaged one is one line naming the damaged file."""
    out = tmp_path / "run"
    shutil.copytree(tod_run, out)
    persona = next(out.glob("persona_*.json"))
    persona.unlink()  # unfinished: the rerun must read the log to resume it
    progress = out / ".progress"
    config, log = progress / "config.json", next(p for p in progress.iterdir() if p.suffix == ".jsonl")
    target = config if damage.endswith("config") else log
    if damage == "binary_config" or damage == "binary_log":
        target.write_bytes(b"\x00\xff\xfe binary\n")
    elif damage == "truncated_config":
        target.write_text(config.read_text()[:10])
    else:
        lines = log.read_text().splitlines(keepends=True)
        log.write_text("".join([lines[0], "{not json at all\n", *lines[1:]]))
    before = snapshot(out)
    code, stderr = run(["data", "tod", "--sgd-dir", SGD, "--individuals", "1", "--out", out])
    assert_one_line(code, stderr, target.name)
    assert snapshot(out) == before
