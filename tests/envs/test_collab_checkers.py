"""Programmatic preference checkers: every checkable preference is satisfied, violated and (where defined) undecided."""

from __future__ import annotations

import pytest

from memrl.core.errors import ConfigError
from memrl.core.preferences import TAXONOMY
from memrl.envs.collab.checkers import (
    CHECKERS,
    CheckResult,
    TurnContext,
    Verdict,
    check,
    is_clarifying_question,
    sentences,
)

OK, BAD, UNSURE = Verdict.SATISFIED, Verdict.VIOLATED, Verdict.UNDECIDABLE
ANSWER = TurnContext()
CLARIFYING = TurnContext(clarifying=True)
ENDING = TurnContext(winding_down=True)

BARE = "The answer is 12."
QUESTION = "Which units should the result be in?"
STEPS = "1. Add 3 and 4 to get 7.\n2. Multiply 7 by 2 to get 14.\n3. Subtract 2, which leaves 12."

CASES: list[tuple[str, str, TurnContext, Verdict]] = [
    # directness
    ("direct", "x = 4, since 2x = 8.", ANSWER, OK),
    ("direct", "# Result\nThe loop runs 10 times.", ANSWER, OK),
    ("direct", "Great question! The loop runs 10 times.", ANSWER, BAD),
    ("direct", "Let me walk you through this. The loop runs 10 times.", ANSWER, BAD),
    ("direct", "Sure! Here's the fix: close the file.", ANSWER, BAD),
    ("direct", "I’d be happy to explain: the loop runs 10 times.", ANSWER, BAD),
    # politeness
    ("polite", "Happy to help! The answer is 12.", ANSWER, OK),
    ("polite", "Thanks for the details. Let's add them up: 12.", ANSWER, OK),
    ("polite", BARE, ANSWER, BAD),
    ("polite", "Do this then that.", ANSWER, BAD),
    ("blunt", BARE, ANSWER, OK),
    ("blunt", "I'm so sorry, but the answer is 12.", ANSWER, BAD),
    ("blunt", "The answer is 12. I hope this helps!", ANSWER, BAD),
    ("blunt", "Please rerun the script with -v.", ANSWER, BAD),
    ("blunt", "Thank you so much for this wonderful question! It is 12.", ANSWER, BAD),
    # analyticality
    ("analytic", "Assuming the rate is constant, distance is 60 * 2, so it is 120 km.", ANSWER, OK),
    ("analytic", "It is 120 km because the car drives 60 km each hour for 2 hours.", ANSWER, OK),
    ("analytic", BARE, ANSWER, BAD),
    ("analytic", BARE, CLARIFYING, UNSURE),
    # guidance
    ("incremental", "Step 1: subtract 3 from both sides. Does this make sense before we continue?", ANSWER, OK),
    ("incremental", "First, factor the quadratic into (x-2)(x-3). Ready to move on to the roots?", ANSWER, OK),
    ("incremental", STEPS + "\nDoes this make sense?", ANSWER, BAD),
    ("incremental", "Isolate x by subtracting 3, then divide by 2, so x = 5.", ANSWER, BAD),
    ("incremental", QUESTION, CLARIFYING, UNSURE),
    ("holistic", STEPS + "\nSo the result is 12.", ANSWER, OK),
    ("holistic", "Let me explain just part 1 first. Part 1 sets up the table. Should I continue?", ANSWER, BAD),
    ("holistic", "Step 1 is to read the file. Want me to proceed with the parsing?", ANSWER, BAD),
    ("holistic", QUESTION, CLARIFYING, UNSURE),
    # proactivity
    ("proactive", "The answer is 12. Next, you could check it by substituting back.", ANSWER, OK),
    ("proactive", "Use a dict for the lookup. You might also want to consider caching the results.", ANSWER, OK),
    ("proactive", "Use a dict for the lookup. Would you like to try writing the cache yourself?", ANSWER, OK),
    ("proactive", "Use a dict for the lookup. As a next step, add tests.", ANSWER, OK),
    ("proactive", "It is (B). Let me know if you'd like me to explain the other options.", ANSWER, OK),
    ("proactive", BARE, ANSWER, BAD),
    ("proactive", QUESTION, CLARIFYING, UNSURE),
    ("no-suggestions", BARE, ANSWER, OK),
    ("no-suggestions", "The answer is 12. You might also want to consider a cache.", ANSWER, BAD),
    ("no-suggestions", "The answer is 12. Here are some next steps: add tests.", ANSWER, BAD),
    ("no-suggestions", "The answer is 12. Next, you could plot it.", ANSWER, BAD),
    ("no-suggestions", "It is (B). If you'd like, I can explain the other options.", ANSWER, BAD),
    # habitual: takeaways
    ("takeaways", "To summarize, we used the chain rule twice.", ENDING, OK),
    ("takeaways", "Key takeaways:\n- integrate by parts\n- check the bounds", ENDING, OK),
    ("takeaways", "Glad that worked, bye!", ENDING, BAD),
    ("takeaways", "To summarize, we used the chain rule twice.", ANSWER, UNSURE),
    ("takeaways", "Glad that worked, bye!", ANSWER, UNSURE),
    # habitual: maximizer
    (
        "multiple-approaches",
        "You could use library X (easier to learn but slower) or library Y (harder but faster).",
        ANSWER,
        OK,
    ),
    ("multiple-approaches", "Approach 1: recursion, short code. Approach 2: a loop, which is faster.", ANSWER, OK),
    ("multiple-approaches", "Sort the list. Alternatively, use a heap; the trade-off is memory.", ANSWER, OK),
    ("multiple-approaches", "Use library X.", ANSWER, BAD),
    ("multiple-approaches", "Option A: use a set. Option B: use a dict.", ANSWER, BAD),
    ("multiple-approaches", QUESTION, CLARIFYING, UNSURE),
    # habitual: planner
    ("outline-first", "Here's what we'll cover: parsing, then testing.\n1. Parse the file.\n2. Test it.", ANSWER, OK),
    ("outline-first", "## Plan\nRead, clean, plot.\n\n## Read\nUse pandas.", ANSWER, OK),
    ("outline-first", "Outline: setup, proof, check.\nSetup: let n = 1. Proof: induct on n.", ANSWER, OK),
    ("outline-first", STEPS, ANSWER, BAD),
    ("outline-first", "We'll go through three steps.", ANSWER, BAD),
    ("outline-first", QUESTION, CLARIFYING, UNSURE),
    # habitual: worked examples
    ("examples", "A closure keeps its variables. For example, a counter function keeps its count.", ANSWER, OK),
    ("examples", "Think of it as a mailbox that holds one letter.", ANSWER, OK),
    ("examples", "A mutex works like a bathroom key: one holder at a time.", ANSWER, OK),
    ("examples", "A mutex is a lock with one holder at a time.", ANSWER, BAD),
    ("examples", QUESTION, CLARIFYING, UNSURE),
    # habitual: general
    ("three-sentences", "Pi is about 3.14. Use it, e.g. for circles. Done", ANSWER, OK),
    ("three-sentences", "Use a set:\n- fast lookups\n- no duplicates", ANSWER, OK),
    ("three-sentences", "One. Two. Three. Four.", ANSWER, BAD),
    ("three-sentences", "Steps:\n- read\n- parse\n- save", ANSWER, BAD),
    ("three-sentences", "It costs $2.50 i.e. cheap. Buy it. Now. Really!", CLARIFYING, BAD),
    ("bullets", "Consider:\n- speed\n- memory", ANSWER, OK),
    ("bullets", "Two causes:\n• heat\n• friction", ANSWER, OK),
    ("bullets", "Do these:\n1. read\n2. write", ANSWER, OK),
    ("bullets", "Speed and memory matter. **Bold** is not a bullet.\n---", ANSWER, BAD),
    ("bullets", QUESTION, CLARIFYING, UNSURE),
    ("numbered-steps", STEPS, ANSWER, OK),
    ("numbered-steps", "1) read\n2) write", ANSWER, OK),
    ("numbered-steps", "Step 1: read the file. Step 2: parse it.", ANSWER, OK),
    ("numbered-steps", "Read the file, parse it, then save it.", ANSWER, BAD),
    ("numbered-steps", "1. Read the file, parse it, then save it.", ANSWER, BAD),
    ("numbered-steps", QUESTION, CLARIFYING, UNSURE),
    ("headings", "## Answer\nIt is 12.", ANSWER, OK),
    ("headings", "## Setup\nInstall it.\n\n## Usage\nRun it.", ANSWER, OK),
    ("headings", "**Setup**\nInstall it.\n\n**Usage**\nRun it.", ANSWER, OK),
    ("headings", "Install it.\n\nRun it.", ANSWER, BAD),
    ("headings", "## Guide\nInstall it.\n\nRun it.", ANSWER, BAD),
    ("headings", QUESTION, CLARIFYING, UNSURE),
    ("tldr", "Use a set for lookups; it is O(1).\n\nTL;DR: use a set.", ANSWER, OK),
    ("tldr", "Use a set for lookups.\n**TLDR** sets are fast.", ANSWER, OK),
    ("tldr", "Use a set for lookups.\nIn short, sets win.", ANSWER, OK),
    ("tldr", "Use a set for lookups.\nSummary: sets win.", ANSWER, OK),
    ("tldr", "Use a set for lookups.", ANSWER, BAD),
    ("tldr", "TL;DR: use a set.\nSets have O(1) lookups.", ANSWER, BAD),
    ("tldr", "Use a set.\nTL;DR:\nsets are fast.", ANSWER, BAD),
    ("tldr", QUESTION, CLARIFYING, UNSURE),
    ("confidence", "The answer is 12 (I'm 90% sure).", ANSWER, OK),
    ("confidence", "The answer is 12. Confidence: high.", ANSWER, OK),
    ("confidence", "I'm 85% confident the bug is in the parser.", ANSWER, OK),
    ("confidence", "The answer is 12, with moderate confidence.", ANSWER, OK),
    ("confidence", BARE, ANSWER, BAD),
    ("confidence", "Growth was 90% last year.", ANSWER, BAD),
    ("confidence", QUESTION, ANSWER, UNSURE),
    ("confidence", BARE, CLARIFYING, UNSURE),
]


@pytest.mark.parametrize(("pid", "response", "context", "expected"), CASES)
def test_checker(pid: str, response: str, context: TurnContext, expected: Verdict) -> None:
    result = check(pid, response, context)
    assert isinstance(result, CheckResult)
    assert (result.preference, result.verdict) == (pid, expected), result.reason
    assert result.reason
    assert "\n" not in result.reason


def test_every_checkable_preference_has_a_checker_and_cases() -> None:
    checkable = {pid for pid, p in TAXONOMY.items() if p.checkable}
    assert set(CHECKERS) == checkable
    for pid in checkable:
        verdicts = {v for p, _, _, v in CASES if p == pid}
        assert {OK, BAD} <= verdicts, pid


def test_checkers_dict_matches_check() -> None:
    assert CHECKERS["three-sentences"]("One. Two.", ANSWER) == check("three-sentences", "One. Two.")


def test_reason_counts_sentences() -> None:
    assert check("three-sentences", "A. B. C. D. E.").reason == "5 sentences, more than 3"


@pytest.mark.parametrize("pid", ["narrative", "intuitive"])
def test_judge_only_is_undecidable(pid: str) -> None:
    result = check(pid, "Now that we have the data, the key idea is averaging.")
    assert result.verdict is UNSURE
    assert result.reason.startswith("judge-only: ")


def test_unknown_id_raises() -> None:
    with pytest.raises(ConfigError, match="did you mean 'bullets'"):
        check("bulets", "- a")


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("Pi is 3.14159. Tau is 6.28.", 2),
        ("Use a map, e.g. a dict, i.e. a hash table. Done.", 2),
        ("Tools: pens, paper, etc. and more. Then stop.", 2),
        ("1. Read it.\n2. Parse it.", 2),
        ("- read\n- parse\n- save", 3),
        ("A wrapped\nsentence here. And another!", 2),
        ("# Heading\nWhat? Yes... Fine", 3),
        ("Code:\n```\nx = 1. y = 2. z = 3.\n```\nEnd.", 2),
        ('He said "stop." Then left.', 2),
    ],
)
def test_sentence_count(text: str, count: int) -> None:
    assert len(sentences(text)) == count, sentences(text)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Which units should the result be in?", True),
        ("Could you share the error message? Do you run Python 3?", True),
        ("Are the edges weighted?", True),
        ("The answer is 12. Any questions?", False),
        ("x = 4. Does this make sense?", False),
        ("Part 1 is done. Should I continue?", False),
        ("Would you like me to add tests?", False),
        ("- a\n- b\nWhich one?", False),
        ("The loop runs 10 times.", False),
        ("Which units? " + "Tell me more about the data you have. " * 10 + "Is it sorted?", False),
    ],
)
def test_is_clarifying_question(response: str, expected: bool) -> None:
    assert is_clarifying_question(response) is expected
