"""Grading drafts: symbolic math, option matching, abstentions, and the LLM judge on a real small model."""

from __future__ import annotations

import asyncio

import pytest

from memrl.core.errors import ConfigError
from memrl.envs.collab.grading import Grade, Grader, grade_choice, grade_math, judge_answer, read_judge_output
from memrl.envs.collab.problems import TASKS, AnswerKind, Problem, problem_id
from memrl.rollout.base import SamplingParams

MEDQA = TASKS["medqa"].parse(
    {
        "problem": "A 6-year-old has bone pain. Cause?\n\nOptions:\nA. Sickle cell trait\nB. Sickle cell disease\n"
        "C. Hemoglobin F\nD. HbC",
        "solution": "Sickle cell disease",
    }
)
MMLU = TASKS["mmlu"].parse(
    {
        "problem": "Which scans image brain function?\n\nChoices:\n"
        "0. I only\n1. II only\n2. III only\n3. II and III only",
        "solution": "III only",
    }
)
MMLU_NUMBERS = TASKS["mmlu"].parse(
    {"problem": "At which step is pre-testing done?\n\nChoices:\n0. 1\n1. 2\n2. 3\n3. 4", "solution": "3"}
)
LOGIQA = TASKS["logiqa"].parse(
    {
        "problem": "Goods fill warehouses.Q: Which fits 1 to 3? Answer Choices: (A)F, M, T (B)G, M, F (C)M, L, F "
        "(D)M, T, F\nA: Among A through D, the answer is",
        "solution": "(C)M, L, F",
    }
)
MATH = Problem(problem_id("math-500", "Half of one?"), "math-500", "Half of one?", "\\frac{1}{2}", AnswerKind.MATH)
FREE = Problem(
    problem_id("free", "Capital of France?"), "free", "What is the capital of France?", "Paris", AnswerKind.FREE
)


@pytest.mark.parametrize(
    ("draft", "gold"),
    [
        ("0.5", "\\frac{1}{2}"),
        ("$-\\pi/6$", "-\\frac{\\pi}{6}"),
        ("-pi/6", "-\\frac{\\pi}{6}"),
        ("The answer is 4", "4"),
        ("So the final answer is $x = 5$.", "5"),
        ("x = 5", "5"),
        ("It costs \\$10,455 in total.", "10455"),
        ("8 + 4 sqrt(3)", "8+4\\sqrt3"),
        ("137.5", "137 \\frac{1}{2}"),
        ("We find $\\boxed{\\frac{\\pi}{4}, \\frac{5\\pi}{4}}$", "\\frac{\\pi}{4}, \\frac{5\\pi}{4}"),
        ("The answer is Evelyn.", "\\text{Evelyn}"),
    ],
)
def test_math_equivalent_forms_are_correct(draft: str, gold: str) -> None:
    grade = grade_math(draft, gold)
    assert grade.correct and not grade.failed, grade


@pytest.mark.parametrize(
    ("draft", "gold"),
    [
        ("The answer is 5", "4"),
        ("0.6", "\\frac{1}{2}"),
        ("The answer is $2\\sqrt{3}$", "2"),  # the leading 2 alone is not the answer
        ("I first thought 4, but the answer is 6.", "4"),
        ("The answer is $\\frac{5\\pi}{4}$", "\\frac{\\pi}{4}, \\frac{5\\pi}{4}"),
        ("It was Bob.", "\\text{Evelyn}"),
        ("I don't know", "4"),
        ("", "4"),
    ],
)
def test_math_wrong_answers_are_incorrect(draft: str, gold: str) -> None:
    assert not grade_math(draft, gold).correct


@pytest.mark.parametrize("draft", ["\\frac{", "}}}{{", "$$$", "no numbers here at all", "x" * 500])
def test_math_grading_never_raises(draft: str) -> None:
    grade = grade_math(draft, "\\frac{1}{2}")
    assert isinstance(grade, Grade) and not grade.correct
    assert grade_math("4", "").failed  # an unparseable gold is a failure, not a wrong answer


@pytest.mark.parametrize(
    ("problem", "draft", "correct"),
    [
        (MEDQA, "B", True),
        (MEDQA, "(B)", True),
        (MEDQA, "The answer is **B**.", True),
        (MEDQA, "B. Sickle cell disease", True),
        (MEDQA, "It's sickle cell disease: Vitamin D plays no part.", True),
        (MEDQA, "The answer is A.", False),
        (MEDQA, "Sickle cell trait", False),
        (MEDQA, "Sickle cell disease (B), though (A) is close.", False),  # names another option by letter
        (MMLU, "2", True),
        (MMLU, "option 2", True),
        (MMLU, "The answer is C", True),  # letters count by position
        (MMLU, "III only", True),
        (MMLU, "II only", False),  # not fooled by 'II only' containing 'I only'
        (MMLU, "The answer is 1", False),
        (MMLU, "1. Statement III holds.\n2. So: III only", True),  # numbered steps are not options
        (MMLU_NUMBERS, "The answer is 3", True),  # where options are numbers, a number is option text
        (MMLU_NUMBERS, "The answer is 2", False),
        (LOGIQA, "(C)", True),
        (LOGIQA, "C: M, L, F", True),
        (LOGIQA, "The goods are M, L, F.", True),
        (LOGIQA, "(A)F, M, T", False),
        (LOGIQA, "Answer: D", False),
    ],
)
def test_choice_grading(problem: Problem, draft: str, correct: bool) -> None:
    grade = grade_choice(draft, problem)
    assert (grade.correct, grade.failed, grade.method) == (correct, False, "choice"), grade


@pytest.mark.parametrize("draft", ["Thalassemia", "either sickle cell disease or sickle cell trait"])
def test_choice_without_a_verdict_is_a_failure(draft: str) -> None:
    grade = grade_choice(draft, MEDQA)
    assert grade.failed and not grade.correct


def test_grader_dispatches_by_kind_and_rejects_abstentions() -> None:
    grader = Grader()

    async def run() -> list[Grade]:
        drafts = [(MATH, "0.5"), (MEDQA, "B"), (LOGIQA, "(A)"), (MATH, "I don't know."), (MEDQA, "  ")]
        return [await grader.grade(problem, draft) for problem, draft in drafts]

    grades = asyncio.run(run())
    assert [g.correct for g in grades] == [True, True, False, False, False]
    assert [g.method for g in grades] == ["math_verify", "choice", "choice", "abstain", "abstain"]


def test_free_answers_need_a_judge() -> None:
    with pytest.raises(ConfigError) as err:
        asyncio.run(Grader().grade(FREE, "Paris"))
    assert "\n" not in str(err.value) and "judge" in str(err.value)


@pytest.mark.parametrize(
    ("text", "correct", "failed"),
    [
        ('{"reasoning": "Same city.", "correct": 1}', True, False),
        ('Sure!\n```json\n{"reasoning": "Different.", "correct": 0}\n```', False, False),
        ('{"reasoning": "ok", "correct": "yes"}', True, False),
        ('{"reasoning": "ok", "correct": "maybe"}', False, True),
        ('{"reasoning": "no verdict"}', False, True),
        ("The answer is right.", False, True),
    ],
)
def test_judge_output_reading(text: str, correct: bool, failed: bool) -> None:
    grade = read_judge_output(text)
    assert (grade.correct, grade.failed, grade.method) == (correct, failed, "judge")
    assert grade.reasoning.startswith("judge output unparseable") == failed


@pytest.mark.slow
@pytest.mark.timeout(300)  # slow: loads and runs the embedded chat model on CPU (two short generations)
def test_judge_on_a_real_model(smollm2: str) -> None:
    from memrl.rollout.hf_local import HFBackend

    backend = HFBackend(smollm2, device="cpu", batch_size=1)
    sampling = SamplingParams(temperature=0.0, max_tokens=64)

    async def run() -> tuple[Grade, Grade]:
        direct = await judge_answer(backend, FREE, "Paris", sampling)
        via_grader = await Grader(backend, sampling).grade(FREE, "It is Lyon.")
        return direct, via_grader

    for grade in asyncio.run(run()):
        assert grade.method == "judge"  # a 135M model may say either, or fail to give JSON: both are reported
        assert grade.failed == grade.reasoning.startswith("judge output unparseable")
        assert not (grade.failed and grade.correct)
    assert backend.usage.requests == 2
