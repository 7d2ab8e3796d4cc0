"""Problem loading for MultiSessionCollab: every original format, sampling, splits, errors, and the arith set."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memrl.core.errors import ConfigError
from memrl.envs.collab import problems as problems_module
from memrl.envs.collab.arith import generate_arith
from memrl.envs.collab.grading import grade_math
from memrl.envs.collab.problems import (
    TASKS,
    AnswerKind,
    Problem,
    check_disjoint,
    get_task,
    last_boxed,
    load_problems,
    split_problems,
)

# Records in the original benchmark's cache format, written here rather than read from its data.
MATH = [
    {
        "problem": "What is $1/2 + 0$?",
        "solution": "Adding zero: $\\boxed{\\frac{1}{2}}$.",
        "level": 1,
        "type": "Algebra",
    },
    {"problem": "Compute $2+3$.", "solution": "First $1+1=2$, then $2+3=\\boxed{5}$.", "level": 1, "type": "Algebra"},
    {
        "problem": "Solve $\\sin 2x = 1$ and $\\cos 2x = 0$ on $[0, 2\\pi)$.",
        "solution": "Try $\\boxed{0}$ first.\n\n"
        "The solutions are $\\boxed{\\frac{\\pi}{4}}$ and $\\boxed{\\frac{5\\pi}{4}}$.",
        "level": 5,
        "type": "Precalculus",
    },
]
MMLU = [
    {
        "problem": "Which scans image brain function?\n\nChoices:\n"
        "0. I only\n1. II only\n2. III only\n3. II and III only",
        "solution": "III only",
    },
    {"problem": "Pick the prime.\n\nChoices:\n0. 4\n1. 6\n2. 7\n3. 9", "solution": "7"},
]
MEDQA = [
    {
        "problem": "A 6-year-old has bone pain. Cause?\n\nOptions:\nA. Sickle cell trait\nB. Sickle cell disease\n"
        "C. Hemoglobin F\nD. HbC",
        "solution": "Sickle cell disease",
    }
]
LOGIQA = [
    {
        "problem": "Goods F, G, L, M, P, T fill warehouses 1 to 6.Q: Which can fill warehouses 1 to 3? "
        "Answer Choices: (A)F, M, T (B)G, M, F (C)M, L, F (D)M, T, F\nA: Among A through D, the answer is",
        "solution": "(A)F, M, T",
    },
    {  # the original data has a record whose options are listed out of order
        "problem": 'Decode the words.Q: Which may be true? Answer Choices: (A)"Dox" means "hostage" '
        '(C)"Mug" means "kidnapping". (B)"Dox" means "student" (D)None of them.\nA: Among A through D, the answer is',
        "solution": '(C)"Mug" means "kidnapping".',
    },
]


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def assert_one_line(err: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_math_answers_come_from_the_last_boxed(tmp_path: Path) -> None:
    problems = load_problems("math-500", write_json(tmp_path / "math.json", MATH))
    assert [p.answer for p in problems] == ["\\frac{1}{2}", "5", "\\frac{\\pi}{4}, \\frac{5\\pi}{4}"]
    assert all(p.kind is AnswerKind.MATH and p.task == "math-500" and p.choices == () for p in problems)
    assert problems[1].solution == MATH[1]["solution"]
    assert problems[0].id.startswith("math-500-") and len({p.id for p in problems}) == 3
    assert last_boxed("no box here") is None
    assert last_boxed("so $\\boxed{\\left(1, \\frac{2}{3}\\right)}$.") == "\\left(1, \\frac{2}{3}\\right)"


@pytest.mark.parametrize(
    ("task", "records", "choices", "answers", "labels"),
    [
        ("mmlu", MMLU, ("I only", "II only", "III only", "II and III only"), ["III only", "7"], ("0", "1", "2", "3")),
        (
            "medqa",
            MEDQA,
            ("Sickle cell trait", "Sickle cell disease", "Hemoglobin F", "HbC"),
            ["Sickle cell disease"],
            None,
        ),
        (
            "logiqa",
            LOGIQA,
            ("F, M, T", "G, M, F", "M, L, F", "M, T, F"),
            ["F, M, T", '"Mug" means "kidnapping".'],
            None,
        ),
    ],
)
def test_choice_caches_parse_options_and_gold(
    tmp_path: Path,
    task: str,
    records: list[dict[str, Any]],
    choices: tuple[str, ...],
    answers: list[str],
    labels: tuple[str, ...] | None,
) -> None:
    problems = load_problems(task, write_json(tmp_path / f"{task}.json", records))
    assert problems[0].choices == choices
    assert [p.answer for p in problems] == answers
    assert all(p.kind is AnswerKind.CHOICE and p.answer in p.choices for p in problems)
    assert problems[0].labels == (labels or ("A", "B", "C", "D"))
    assert problems[0].question == records[0]["problem"]  # the user is shown the question exactly as the benchmark did


def test_logiqa_out_of_order_options_are_sorted_by_label(tmp_path: Path) -> None:
    problem = load_problems("logiqa", write_json(tmp_path / "l.json", LOGIQA))[1]
    assert problem.choices[1:3] == ('"Dox" means "student"', '"Mug" means "kidnapping".')
    assert problem.answer_index == 2


def test_hub_columns_from_parquet(tmp_path: Path) -> None:
    """The hub datasets' own columns, as `datasets` would hand them over, parse to the cache format's problems."""
    tables = {
        "mmlu": {
            "question": ["Pick the prime."],
            "subject": ["math"],
            "choices": [["4", "6", "7", "9"]],
            "answer": [2],
        },
        "medqa": {
            "question": ["A 6-year-old has bone pain. Cause?"],
            "answer": ["Sickle cell disease"],
            "options": [{"A": "Sickle cell trait", "B": "Sickle cell disease", "C": "Hemoglobin F", "D": "HbC"}],
            "answer_idx": ["B"],
        },
        "logiqa": {
            "query": [LOGIQA[0]["problem"]],
            "choices": [["(A)F, M, T", "(B)G, M, F", "(C)M, L, F", "(D)M, T, F"]],
            "gold": [[0]],
        },
        "math-500": {"problem": ["Compute $2+3$."], "solution": ["It is $\\boxed{5}$."], "answer": ["5"]},
    }
    for task, columns in tables.items():
        path = tmp_path / f"{task}.parquet"
        pq.write_table(pa.table(columns), path)
        (hub,) = load_problems(task, path)
        cache_records = {"mmlu": MMLU[1:], "medqa": MEDQA, "logiqa": LOGIQA[:1], "math-500": MATH[1:2]}[task]
        (cached,) = load_problems(task, write_json(tmp_path / f"{task}.json", cache_records))
        assert (hub.question, hub.answer, hub.choices, hub.id) == (
            cached.question,
            cached.answer,
            cached.choices,
            cached.id,
        )


def test_json_data_jsonl_and_cache_folder_agree(tmp_path: Path) -> None:
    as_list = load_problems("mmlu", write_json(tmp_path / "a.json", MMLU))
    as_data = load_problems("mmlu", write_json(tmp_path / "b.json", {"data": MMLU}))
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in MMLU) + "\n", encoding="utf-8")
    assert as_list == as_data == load_problems("mmlu", jsonl)
    # The original layout: <root>/<task folder>/{testset,trainset}_size*_seed*.json; a question in both is kept once.
    root = tmp_path / "cache"
    write_json(root / "math_hard" / "testset_size2_seed42.json", MATH[:2])
    write_json(root / "math_hard" / "trainset_size2_seed42.json", MATH[1:])
    from_root = load_problems("math_hard", root)
    assert [p.answer for p in from_root] == ["\\frac{1}{2}", "5", "\\frac{\\pi}{4}, \\frac{5\\pi}{4}"]
    assert from_root == load_problems("math-hard", root / "math_hard")


def test_problem_records_round_trip(tmp_path: Path) -> None:
    problems = load_problems("medqa", write_json(tmp_path / "m.json", MEDQA))
    records = json.loads(json.dumps([p.to_record() for p in problems]))
    assert [Problem.from_record(r) for r in records] == problems
    assert load_problems("medqa", write_json(tmp_path / "saved.json", records)) == problems


def test_limit_samples_deterministically(tmp_path: Path) -> None:
    records = [{"problem": f"What is {i} + {i}?", "solution": f"$\\boxed{{{2 * i}}}$"} for i in range(30)]
    path = write_json(tmp_path / "many.json", records)
    five = load_problems("math-500", path, limit=5, seed=3)
    assert five == load_problems("math-500", path, limit=5, seed=3)
    assert len(five) == 5 and len({p.id for p in five}) == 5
    assert five != load_problems("math-500", path, limit=5, seed=4)
    assert load_problems("math-500", path, limit=10, seed=3)[:5] == five  # a larger draw extends a smaller one
    assert len(load_problems("math-500", path, limit=100, seed=3)) == 30


def _arith(n: int) -> list[Problem]:
    return generate_arith(n, seed=11)


def test_split_is_deterministic_and_disjoint() -> None:
    problems = _arith(20)
    train, evaluation = split_problems(problems, 6, seed=1)
    assert (len(train), len(evaluation)) == (14, 6)
    assert (train, evaluation) == split_problems(problems, 6, seed=1)
    assert evaluation != split_problems(problems, 6, seed=2)[1]
    assert sorted(p.id for p in train + evaluation) == sorted(p.id for p in problems)
    check_disjoint(train, evaluation)
    assert len(split_problems(problems, 0.25, seed=1)[1]) == 5
    with pytest.raises(ConfigError):
        split_problems(problems, 21, seed=1)


def test_overlap_is_found_by_question_text() -> None:
    train, evaluation = split_problems(_arith(10), 3, seed=0)
    # Same question with different case and spacing, under a different id: still the same problem.
    twin = dataclasses.replace(train[0], id="elsewhere-1", question="  " + train[0].question.upper() + " ")
    with pytest.raises(ConfigError) as err:
        check_disjoint(train, [*evaluation, twin])
    message = assert_one_line(err)
    assert "1 eval problem" in message and "elsewhere-1" in message


def test_unknown_task_suggests_the_closest() -> None:
    with pytest.raises(ConfigError) as err:
        get_task("math_hrad")
    message = assert_one_line(err)
    assert "did you mean 'math-hard'" in message
    assert all(name in message for name in TASKS)
    assert get_task("math_hard").name == "math-hard"
    assert get_task("math500").name == "math-500"
    with pytest.raises(ConfigError):
        load_problems("gsm8k")


def test_missing_file_and_malformed_record(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError) as err:
        load_problems("mmlu", missing)
    assert str(missing) in assert_one_line(err)
    bad = write_json(tmp_path / "bad.json", [MATH[0], {"problem": "No box.", "solution": "It is 4."}])
    with pytest.raises(ConfigError) as err:
        load_problems("math-500", bad)
    message = assert_one_line(err)
    assert str(bad) in message and "record 1" in message
    wrong_gold = write_json(tmp_path / "gold.json", [{**MMLU[1], "solution": "8"}])
    with pytest.raises(ConfigError, match="record 0"):
        load_problems("mmlu", wrong_gold)
    not_json = tmp_path / "broken.json"
    not_json.write_text("[{", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken\.json"):
        load_problems("mmlu", not_json)


def test_unreachable_hub_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # conftest sets HF_HUB_OFFLINE=1; a dataset nobody has cached then fails at once.
    spec = dataclasses.replace(TASKS["mmlu"], hub_id="memrl-tests/no-such-dataset")
    monkeypatch.setitem(problems_module.TASKS, "mmlu", spec)
    with pytest.raises(ConfigError) as err:
        load_problems("mmlu")
    message = assert_one_line(err)
    assert "memrl-tests/no-such-dataset" in message and "local" in message


def test_every_task_describes_the_users_goal() -> None:
    for spec in TASKS.values():
        assert spec.description.startswith("You are trying to") and "\n" not in spec.description
        assert spec.hub_id is not None or spec.generator is not None


def test_arith_is_deterministic_distinct_and_self_consistent() -> None:
    problems = generate_arith(120, seed=5)
    assert problems == generate_arith(120, seed=5)
    assert generate_arith(60, seed=5) == problems[:60]
    assert generate_arith(60, seed=6) != problems[:60]
    assert len({p.question for p in problems}) == len({p.id for p in problems}) == 120
    assert len({p.question.split()[0] for p in problems}) > 5  # a mix of templates, not one
    for p in problems:
        assert p.task == "arith" and p.kind is AnswerKind.MATH and p.answer.lstrip("-").isdigit()
        assert grade_math(p.solution, p.answer).correct, p
        assert not grade_math(p.solution, str(int(p.answer) + 1)).correct, p


def test_arith_loads_without_data() -> None:
    default = load_problems("arith")
    assert len(default) == 200
    sample = load_problems("arith", limit=15, seed=2)
    assert sample == load_problems("arith", limit=15, seed=2) != load_problems("arith", limit=15, seed=3)
    assert {p.id for p in sample} <= {p.id for p in default}
    assert len(load_problems("arith", limit=250, seed=0)) == 250
