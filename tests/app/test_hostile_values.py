"""Hostile input, by cause: text no encoding writes, values Python refuses, JSON lines split where they
are not, values of the wrong type taken as text, names that leave the run folder, reruns that mix two setups, lines
that do not say what is wrong, and a pattern that took quadratic time. Several instances of each cause, each one
`memrl: error:` line and exit 2 (no traceback), or, where the input is valid, the right result.

The CLI runs in-process (`support.memrl_in_process`) except where what is checked is the process's own output
encoding; endpoints are a real HTTP server on 127.0.0.1 scripted to answer what a broken or hostile server would.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support import FIXTURES, MEMRL_ARGV, memrl_in_process
from test_hostile_inputs import assert_one_line

# ---- a scripted endpoint ---------------------------------------------------------------------------------------

LONE = ["\ud800", "\udfff", "a\ud83dz"]  # a high surrogate, a low one, half of an emoji's pair
BODIES: dict[str, bytes] = {
    **{f"lone{i}": json.dumps({"choices": [{"message": {"content": text}}]}).encode() for i, text in enumerate(LONE)},
    "deep": ("[" * 100_000 + "]" * 100_000).encode(),
    "deep_object": ('{"a": ' * 50_000 + "1" + "}" * 50_000).encode(),
    "verdict": json.dumps({"choices": [{"message": {"content": '{"score": 2, "reasoning": "ok"}'}}]}).encode(),
}
MODEL_LISTS = {"models_list": [1, 2], "models_null": None, "models_text": "m", "models_ids": {"data": [{"id": 3}]}}


class _Scripted(BaseHTTPRequestHandler):
    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(BODIES.get(self.path.split("/")[1], BODIES["verdict"]))

    def do_GET(self) -> None:  # /v1/models
        self._send(json.dumps(MODEL_LISTS.get(self.path.split("/")[1], {"data": [{"id": "m"}]})).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def run(argv: list[object], cwd: Path | None = None) -> tuple[int, str]:
    return memrl_in_process(argv, cwd=cwd)


def recipe(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- text no encoding writes: lone surrogates --------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(LONE)))
def test_an_endpoint_answering_a_lone_surrogate_is_printed_escaped(index: int, endpoint: str) -> None:
    """The process's own stdout (a pipe: strict UTF-8) takes the reply as an escape, not a UnicodeEncodeError."""
    done = subprocess.run(
        [*MEMRL_ARGV, "chat", "--endpoint", f"{endpoint}/lone{index}/v1", "--model", "m", "hi"],
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert done.stdout.decode("utf-8").strip() == LONE[index].encode("utf-8", "backslashreplace").decode()


@pytest.mark.parametrize("name", ["a\\ud800b", "run\\udfff", "\\ud83d"])
def test_a_recipe_name_no_folder_can_take_is_one_line(name: str, tmp_path: Path) -> None:
    path = recipe(tmp_path, f'extends: generate\nname: "{name}"\n')
    for command in (["recipes", "show", path], ["run", path, "--dry-run"]):
        assert_one_line(*run(command, tmp_path), "name:", "is not a plain name")
    assert not (tmp_path / "runs").exists()


def test_prompts_holding_lone_surrogates_are_answered_and_written(tmp_path: Path, tiny_qwen2: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"x{text}y"}) + "\n" for text in LONE))
    out = tmp_path / "run"
    args = ["run", "generate", f"output_dir={out}", "models.policy.model=tiny-qwen2", "stages.generate.prompts=[]",
            f"stages.generate.prompts_file={prompts}", "stages.generate.sampling.max_tokens=2"]  # fmt: skip
    code, stderr = run(args, tmp_path)
    assert code == 0, stderr[-2000:]
    written = (out / "generate" / "generations.jsonl").read_bytes()
    written.decode("utf-8")  # valid UTF-8: each lone surrogate is a JSON escape
    assert [json.loads(line)["prompt"] for line in written.splitlines()] == [f"x{t}y" for t in LONE]
    assert run(args, tmp_path)[0] == 0  # and a rerun reads them back: nothing to do


# ---- values Python refuses ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('output_dir: "a\\0b"\n', "output_dir"),
        ('description: "\\0"\n', "description"),
        ('stages:\n  generate: {prompts_file: "p\\0.jsonl"}\n', "stages.generate.prompts_file"),
    ],
)
def test_a_nul_in_a_recipe_value_is_one_line(text: str, key: str, tmp_path: Path) -> None:
    path = recipe(tmp_path, "extends: generate\nname: n\n" + text)
    for command in (["run", path, "--dry-run"], ["run", path, "--stage", "pull"]):
        assert_one_line(*run(command, tmp_path), key, "holds a NUL character")


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("stages.pull.models." + "9" * 5000 + "=x", "is not one of its indices"),
        ("stages.pull.models." + "1" * 20 + "=x", "is not one of its indices"),
        ("seed=" + "9" * 5000, "a value YAML cannot hold here"),
        ("description=[" + "7" * 4400 + "]", "a value YAML cannot hold here"),
        (".".join(["a"] * 3000) + "=x", "nested more than 64 levels deep"),
        (".".join(["stages"] * 65) + "=1", "nested more than 64 levels deep"),
    ],
)
def test_an_override_python_refuses_is_one_line(override: str, why: str, tmp_path: Path) -> None:
    line = assert_one_line(*run(["recipes", "show", "generate", override], tmp_path), why)
    assert len(line) < 600  # the override is quoted cut short, not in full


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1/v1", "Invalid IPv6 URL"),
        ("http://[fe80::1%zz/v1", "not a URL"),
        ("http://127.0.0.1:99999/v1", "not a URL"),
        ("http://127.0.0.1:9/" + "a" * 120_000, "a URL of 120019 characters"),
        ("ftp://127.0.0.1/v1", "not an http(s):// URL"),
    ],
)
def test_an_endpoint_url_the_clients_refuse_is_one_line(url: str, why: str) -> None:
    started = time.monotonic()
    line = assert_one_line(*run(["chat", "--endpoint", url, "--model", "m", "--retries", "0", "hi"]), why)
    assert len(line) < 600 and time.monotonic() - started < 10


@pytest.mark.parametrize("answer", ["deep", "deep_object"])
def test_an_endpoint_answering_json_nested_past_the_stack_is_one_line(answer: str, endpoint: str) -> None:
    args = ["chat", "--endpoint", f"{endpoint}/{answer}/v1", "--model", "m", "--retries", "0", "hi"]
    assert_one_line(*run(args), "sent a malformed response (JSON nested too deeply)")


@pytest.mark.parametrize("listing", MODEL_LISTS)
def test_a_judge_whose_model_list_is_no_list_is_one_line(listing: str, endpoint: str, tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text('{"user_preferences_reasoning": "r", "agent_notes": "- be direct"}')
    (tmp_path / "e.txt").write_text("be direct\n")
    args = ["reward", "score", "--reflection-file", tmp_path / "r.txt", "--enforcements-file", tmp_path / "e.txt",
            "--judge", "llm", "--endpoint", f"{endpoint}/{listing}/v1", "--model", "m",
            "--cache-dir", tmp_path / "c"]  # fmt: skip
    assert_one_line(*run(args), f"{endpoint}/{listing}/v1", "not a list of models (GET /models)")


# ---- JSON lines: split at "\n" only ------------------------------------------------------------------------------

SEPARATORS = ["\u2028", "\u2029", "\x85"]  # raw inside a JSON string they are valid; splitlines() splits there


@pytest.mark.parametrize("sep", SEPARATORS)
def test_json_lines_holding_line_separators_are_read_whole(sep: str, tmp_path: Path) -> None:
    from memrl.core.files import ResumableJsonl, read_jsonl
    from memrl.envs.collab.problems import load_problems
    from memrl.envs.collab.profiles import load_profiles

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"one{sep}prompt {i}"}, ensure_ascii=False) + "\n" for i in range(3))
    )
    code, out = memrl_in_process(
        ["run", "generate", "stages.generate.prompts=[]", f"stages.generate.prompts_file={prompts}", "--dry-run"],
        cwd=tmp_path, stdout=True,
    )  # fmt: skip
    assert code == 0 and "generate: 3 prompts to model" in out, out
    problem = {"task": "arith", "question": f"What is 2+2?{sep}Answer.", "answer": "4", "kind": "math"}
    (tmp_path / "q.jsonl").write_text(json.dumps(problem, ensure_ascii=False) + "\n")
    assert load_problems("arith", tmp_path / "q.jsonl")[0].question == problem["question"]
    profile = {"id": "u", "persona": f"a{sep}b", "preferences": ["blunt", "no-suggestions", "three-sentences"]}
    (tmp_path / "u.jsonl").write_text(json.dumps(profile, ensure_ascii=False) + "\n")
    assert load_profiles(tmp_path / "u.jsonl")[0].persona == f"a{sep}b"
    # memrl's own records, fed back: written on one line each, read back whole.
    sink = ResumableJsonl(tmp_path / "generations.jsonl")
    sink.append({"key": "k", "completion": f"x{sep}y"})
    assert len((tmp_path / "generations.jsonl").read_text(encoding="utf-8").splitlines()) == 1
    assert read_jsonl(tmp_path / "generations.jsonl") == [{"key": "k", "completion": f"x{sep}y"}]
    assert ResumableJsonl(tmp_path / "generations.jsonl").done == {"k"}


# ---- values of the wrong type taken as text ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"prompt": ["a", "b"]}', "a 'prompt' that is a list"),
        ('{"prompt": null}', "a 'prompt' that is null"),
        ('{"prompt": {"text": "hi"}}', "a 'prompt' that is an object"),
        ('{"prompt": 7}', "a 'prompt' that is a number"),
        ('{"prompt": 1e309}', "the number 1e309 is too large"),
        ('{"prompt": NaN}', "NaN is no JSON value"),
        ('{"prompt": -Infinity}', "-Infinity is no JSON value"),
        ('{"text": "hi"}', "no 'prompt' field"),
    ],
)
def test_a_prompt_that_is_no_text_is_one_line(line: str, why: str, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n' + line + "\n")
    args = ["run", "generate", f"stages.generate.prompts_file={prompts}", "--dry-run"]
    assert_one_line(*run(args, tmp_path), f"{prompts}:2", why)


@pytest.mark.parametrize(
    ("field", "value"),
    [("question", None), ("question", ["x"]), ("answer", None), ("question", {"q": 1}), ("answer", True)],
)
def test_a_collab_problem_field_that_is_no_text_is_one_line(field: str, value: object, tmp_path: Path) -> None:
    problem = {"task": "arith", "question": "What is 2+2?", "answer": "4", "kind": "math", field: value}
    (tmp_path / "q.jsonl").write_text(json.dumps(problem) + "\n")
    args = ["eval", "collab", "--problems", tmp_path / "q.jsonl", "--users", "1", "--out", tmp_path / "o"]
    assert_one_line(*run(args, tmp_path), f"{tmp_path / 'q.jsonl'}: record 0", f"{field} must be text")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("name: d\nname: e\n", "key 'name' is given twice (line 3)"),
        (
            "name: d\nstages:\n  generate: {sampling: {temperature: 0.1, temperature: 0.2}}\n",
            "'temperature' is given twice",
        ),
        ("name: d\nseed: true\n", "seed: expected a number, got true"),
        ("name: d\nstages:\n  generate: {sampling: {max_tokens: false}}\n", "max_tokens: expected a number, got false"),
        ("name: d\nstages:\n  generate: {sampling: {temperature: yes}}\n", "temperature: expected a number, got true"),
    ],
)
def test_a_duplicate_key_or_a_boolean_number_in_a_recipe_is_one_line(text: str, why: str, tmp_path: Path) -> None:
    path = recipe(tmp_path, "extends: generate\n" + text)
    assert_one_line(*run(["recipes", "show", path], tmp_path), why)


# ---- names that leave the run folder -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../escaped_stage", "..", "a/b", "/tmp/abs", ".", "sp ace", "x" * 101])
def test_a_stage_name_is_a_plain_name(name: str, tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    path = recipe(
        tmp_path, f'extends: generate\nname: e\nstages:\n  "{name}": {{kind: pull_models, models: [tiny-qwen2]}}\n'
    )
    for command in (["run", path, "--dry-run"], ["run", path, f"output_dir={tmp_path / 'a' / 'b' / 'o'}"]):
        assert_one_line(*run(command, tmp_path), "stages: stage name", "is not a plain name")
    assert sorted(p.name for p in (tmp_path / "a").rglob("*")) == ["b"]  # nothing written anywhere


# ---- reruns that would mix two setups ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    ["stages.generate.sampling.temperature=0.5", "models.policy.model=tiny-llama", "stages.generate.system=be brief"],
)
def test_a_rerun_with_another_setup_is_refused_and_changes_nothing(
    change: str, tmp_path: Path, tiny_qwen2: str, tiny_llama: str
) -> None:
    out = tmp_path / "run"
    args = ["run", "generate", f"output_dir={out}", "models.policy.model=tiny-qwen2", "stages.generate.prompts=[hi]",
            "stages.generate.sampling.max_tokens=2"]  # fmt: skip
    assert run(args, tmp_path)[0] == 0
    before = {p.name: p.read_bytes() for p in (out, out / "generate") for p in p.iterdir() if p.is_file()}
    assert_one_line(*run([*args, change], tmp_path), str(out), "holds a run of another setup", change.partition("=")[0])
    assert {p.name: p.read_bytes() for p in (out, out / "generate") for p in p.iterdir() if p.is_file()} == before
    assert run(["resume", out], tmp_path)[0] == 0  # the saved setup goes on


@pytest.mark.parametrize("key", ["sk-literal-key-0123456789", "**********"])
def test_a_key_written_into_a_recipe_is_never_resumed_as_its_mask(key: str, tmp_path: Path) -> None:
    path = recipe(tmp_path, f"extends: endpoint\nname: k\nmodels:\n  policy: {{api_key: '{key}'}}\n")
    code, stderr = run(["run", path, f"output_dir={tmp_path / 'run'}", "--dry-run"], tmp_path)
    if "*" in key:  # a mask given as a key: refused at once
        assert_one_line(code, stderr, "models.policy.api_key", "is the mask memrl saves in place of a key")
        return
    assert code == 0, stderr[-2000:]
    (tmp_path / "run").mkdir()
    resolved = tmp_path / "run" / "recipe.resolved.yaml"
    saved = {"backend": "openai", "model": "m", "endpoint": "http://127.0.0.1:9/v1", "api_key": "**********"}
    resolved.write_text(json.dumps({"name": "k", "models": {"policy": saved}}))
    assert_one_line(*run(["resume", tmp_path / "run", "--dry-run"], tmp_path), "api_key", "is the mask")
    assert key not in resolved.read_text()


# ---- lines that say what is wrong ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["garbage\n", "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"])
def test_a_broken_ssl_cert_file_matters_only_for_https_and_is_named(
    bad: str, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ca.pem").write_text(bad)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    code, stderr = run(["chat", "--endpoint", f"{endpoint}/v1", "--model", "m", "hi"])
    assert code == 0, stderr  # plain http: no certificate is read
    args = ["chat", "--endpoint", "https://127.0.0.1:9/v1", "--model", "m", "--retries", "0", "hi"]
    assert_one_line(*run(args), f"SSL_CERT_FILE={tmp_path / 'ca.pem'}", "cannot load TLS certificates")


@pytest.mark.parametrize("variable", ["http_proxy", "HTTP_PROXY"])
def test_a_dead_proxy_is_named_not_blamed_on_the_endpoint(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "http://127.0.0.1:9")
    args = ["chat", "--endpoint", "http://example.invalid:8000/v1", "--model", "m", "--retries", "0", "hi"]
    assert_one_line(*run(args), f"unreachable through the proxy {variable}=http://127.0.0.1:9")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
def test_an_empty_problem_file_is_named(suffix: str, tmp_path: Path) -> None:
    path = tmp_path / f"empty{suffix}"
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"question": pa.array([], pa.string())}), path)
    else:
        path.write_text("[]\n" if suffix == ".json" else "")
    args = ["eval", "collab", "--problems", path, "--users", "1", "--out", tmp_path / "o"]
    assert_one_line(*run(args, tmp_path), f"{path}: holds no problems")


@pytest.mark.parametrize("value", ["sk-abcdefgh12345: x", "tok-abcdefgh: {a: 1}", "[sk-abcdefgh12345, 2]"])
def test_a_secret_that_reads_as_yaml_is_never_echoed(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_TOKEN", value)
    path = recipe(tmp_path, "extends: generate\nname: s\nseed: ${MY_TOKEN}\n")
    line = assert_one_line(*run(["recipes", "show", path], tmp_path), "seed")
    assert "abcdefgh" not in line


def test_skipped_sessions_are_counted_in_words() -> None:
    from memrl.data_gen.reflection import SkipCounts

    assert SkipCounts(1, 0, 2).describe() == (
        "1 with nothing to learn (no preference enforced), 2 whose teacher reflection did not parse"
    )


@pytest.mark.parametrize(
    "message",
    [
        "The actor 1f2e3d4c5b6a79880716253443526170 is unavailable: \x1b[36mray::EpisodeWorker\x1b[0m (pid=123)",
        "\x1b[31mActorDiedError\x1b[0m: The actor died unexpectedly before finishing. f0e1d2c3b4a5968778695a4b3c2d1e0f",
    ],
)
def test_a_dead_worker_is_said_without_ids_or_colour_codes(message: str) -> None:
    from memrl.envs.pool import death

    said = death(RuntimeError(message))
    assert "\x1b" not in said and not any(len(word) >= 16 and word.isalnum() for word in said.split()), said


@pytest.mark.parametrize("index", ["--1", "-+1", "1.0", "0x1", "1" * 30])
def test_a_scenario_index_int_refuses_is_one_line(index: str, tmp_path: Path) -> None:
    shop = FIXTURES / "pahf" / "shopping"
    args = ["pahf", "feedback", "--persona-table", shop / "persona_info.json", "--scenario",
            f"{shop / 'phase1.json'}:{index}", "--choice", "A"]  # fmt: skip
    assert_one_line(*run(args, tmp_path), "--scenario", "PHASEFILE:INDEX")


@pytest.mark.parametrize("value", ["0.5", "NaN", None, [0.5]])
def test_metrics_that_are_not_numbers_are_refused(value: object, tmp_path: Path) -> None:
    for side in ("memory", "baseline"):
        (tmp_path / side).mkdir()
        session = {"session": 0, "task_success": 0.5, "user_effort": 1.0, "length": 10.0}
        (tmp_path / side / "metrics.json").write_text(json.dumps({"per_session": [session]}))
    bad = {"session": 0, "task_success": value, "user_effort": 1.0, "length": 10.0}
    (tmp_path / "memory" / "metrics.json").write_text(json.dumps({"per_session": [bad]}))
    args = [
        "collab",
        "compare",
        "--memory",
        tmp_path / "memory",
        "--baseline",
        tmp_path / "baseline",
        "--out",
        tmp_path / "o",
    ]
    assert_one_line(*run(args, tmp_path), str(tmp_path / "memory" / "metrics.json"), "not the metrics of a collab run")


# ---- patience --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [40_000, 120_000])
def test_finding_credentials_in_a_long_value_takes_linear_time(size: int) -> None:
    from memrl.core.secrets import redact, url_credentials

    for text in ("a" * size, "a://" * (size // 4), "x" * size + "://u:p4ssw0rd-long@h/"):
        started = time.monotonic()
        url_credentials(text)
        redact(text, environ={}, argv=[])
        assert time.monotonic() - started < 1.0
    assert url_credentials("x" * size + "https://u:p4ssw0rd-long@h/") == ["p4ssw0rd-long"]
