"""The preference taxonomy: ids, categories, opposites, lookup errors and mapping of original-benchmark sentences."""

from __future__ import annotations

import pytest

from memrl.core.errors import ConfigError
from memrl.core.preferences import TAXONOMY, Category, as_prompt_text, from_original, get_preference

IDS = [
    "direct",
    "narrative",
    "polite",
    "blunt",
    "analytic",
    "intuitive",
    "incremental",
    "holistic",
    "proactive",
    "no-suggestions",
    "takeaways",
    "multiple-approaches",
    "outline-first",
    "examples",
    "three-sentences",
    "bullets",
    "numbered-steps",
    "headings",
    "tldr",
    "confidence",
]

# Our own paraphrases in the original benchmark's style, each carrying one preference's original_key.
ORIGINAL_STYLE = {
    "direct": "The user likes answers that get directly to the point, skipping any warm-up.",
    "narrative": "The user wants replies that are narrative, conversational, and engaging in tone.",
    "polite": "The user expects the assistant to be respectful, considerate, and friendly at all times.",
    "blunt": "The user wants it blunt without pleasantries of any kind.",
    "analytic": "The user wants the assistant to state relevant assumptions and derive every result.",
    "intuitive": "The user wants high-level intuition before any calculation.",
    "incremental": "Each reply should handle a single small increment and then pause.",
    "holistic": "The user favors holistic responses covering everything at once.",
    "proactive": "Every reply should close with a proactive suggestion for what to do next.",
    "no-suggestions": "The user dislikes unsolicited suggestions added to an answer.",
    "takeaways": "Near the end, the user wants key takeaways listed.",
    "multiple-approaches": "The user wants multiple viable approaches compared side by side.",
    "outline-first": "Start with an outline of what will be covered, then proceed.",
    "examples": "Explanations should contain examples, analogies or metaphors to make them concrete.",
    "three-sentences": "Replies must be no longer than three sentences in total.",
    "bullets": "The user reads best in bullet-point format.",
    "numbered-steps": "The user wants numbered steps for any procedure.",
    "headings": "Long replies need headings for each section.",
    "tldr": "The user wants a one-line TL;DR closing every reply.",
    "confidence": "Answers should come with confidence estimates attached.",
}


def test_taxonomy_ids_in_order() -> None:
    assert list(TAXONOMY) == IDS
    assert all(TAXONOMY[pid].id == pid for pid in IDS)


def test_six_categories_all_used() -> None:
    assert [c.value for c in Category] == [
        "directness",
        "politeness",
        "analyticality_intuitiveness",
        "guidance",
        "proactivity",
        "habitual_strategies",
    ]
    assert {p.category for p in TAXONOMY.values()} == set(Category)


def test_opposites_symmetric_and_same_category() -> None:
    for p in TAXONOMY.values():
        if p.opposite is None:
            assert p.category is Category.HABITUAL_STRATEGIES
            continue
        other = TAXONOMY[p.opposite]
        assert other.opposite == p.id
        assert other.category is p.category


def test_strategy_only_for_habitual() -> None:
    strategies = {"takeaways", "maximizer", "planner", "worked-examples", "general"}
    for p in TAXONOMY.values():
        if p.category is Category.HABITUAL_STRATEGIES:
            assert p.strategy in strategies
        else:
            assert p.strategy is None
    assert {p.strategy for p in TAXONOMY.values()} - {None} == strategies


def test_judge_only_preferences() -> None:
    assert {pid for pid, p in TAXONOMY.items() if not p.checkable} == {"narrative", "intuitive"}


def test_original_keys_unique_and_not_nested() -> None:
    keys = [p.original_key.lower() for p in TAXONOMY.values()]
    assert len(set(keys)) == len(keys)
    for a in keys:
        assert [b for b in keys if a in b] == [a]  # no key inside another: mapping is unambiguous


def test_get_preference() -> None:
    assert get_preference("tldr") is TAXONOMY["tldr"]


@pytest.mark.parametrize(("typo", "suggestion"), [("bulets", "bullets"), ("proactiv", "proactive"), ("tl-dr", "tldr")])
def test_unknown_id_suggests_closest(typo: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as err:
        get_preference(typo)
    message = str(err.value)
    assert "\n" not in message
    assert f"unknown preference {typo!r}; did you mean {suggestion!r}?" in message


def test_unknown_id_without_close_match() -> None:
    with pytest.raises(ConfigError, match="unknown preference 'zzzzzz'") as err:
        get_preference("zzzzzz")
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize("pid", IDS)
def test_from_original_maps_key(pid: str) -> None:
    sentence = ORIGINAL_STYLE[pid]
    assert TAXONOMY[pid].original_key.lower() in sentence.lower()
    assert from_original(sentence).id == pid
    assert from_original("  " + sentence.upper().replace(" ", "\n  ")).id == pid  # case and whitespace do not matter


def test_from_original_no_match_is_one_line() -> None:
    with pytest.raises(ConfigError, match="matches no known preference") as err:
        from_original("You prefer the agent to reply in French.\nAlways.")
    assert "\n" not in str(err.value)


def test_from_original_ambiguous() -> None:
    with pytest.raises(ConfigError, match="several preferences: bullets, headings"):
        from_original("Use bullet-point format and headings for each section.")


@pytest.mark.parametrize("pid", IDS)
def test_descriptions_are_our_own(pid: str) -> None:
    p = TAXONOMY[pid]
    text = as_prompt_text(p)
    assert text == f"{p.description} {p.enforce_when}"
    assert p.description.startswith("You ") or p.description.startswith("When ") or p.description.startswith("On ")
    assert p.original_key.lower() not in text.lower()  # never the original wording
    assert text not in ORIGINAL_STYLE.values()
