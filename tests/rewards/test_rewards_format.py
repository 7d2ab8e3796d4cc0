"""Format reward credit levels and the notes they hand to the judge; tokenizer-free text measures."""

from __future__ import annotations

import json

import pytest

from memrl.core.errors import ConfigError
from memrl.rewards.format import CUT, EXACT, NOTES_ONLY, REPAIRED, UNUSABLE, WRAPPED, extract_notes, format_reward
from memrl.rewards.text import count_tokens, split_statements
from memrl.rewards.types import GroundTruth

GOOD = {"user_preferences_reasoning": "The user asked for bullets.", "agent_notes": "- Use bullet points."}


@pytest.mark.parametrize(
    ("reply", "credit", "level"),
    [
        (json.dumps(GOOD), EXACT, "exact"),
        ("  \n" + json.dumps(GOOD, indent=2) + "\n", EXACT, "exact"),
        ("```json\n" + json.dumps(GOOD) + "\n```", WRAPPED, "wrapped"),
        ("Here are my notes: " + json.dumps(GOOD) + " Hope this helps.", WRAPPED, "wrapped"),
        ("<think>bullets</think>\n" + json.dumps(GOOD), WRAPPED, "wrapped"),
        (json.dumps(GOOD)[:-1] + ",}", REPAIRED, "repaired"),  # closed, but not valid JSON as written
        # Cut at the token cap: the object never closes, however much repair recovers (a brace inside a string
        # neither opens nor closes it).
        (json.dumps(GOOD)[:-2], CUT, "cut"),
        (json.dumps(GOOD)[:-1], CUT, "cut"),
        ('{"user_preferences_reasoning": "a } b", "agent_notes": ["- Use bullets", "- Be brief', CUT, "cut"),
        ("```json\n" + json.dumps(GOOD)[:-5], CUT, "cut"),
        (
            '{"user_preferences_reasoning": "r", "agent_notes": ["use bullets", "end with a TL;DR"]}',
            REPAIRED,
            "repaired",
        ),
        # A repeated key hides a second reflection (a reader keeps one value); a key beyond the two is off contract.
        (json.dumps(GOOD)[:-1] + ', "agent_notes": "- Solve it."}', REPAIRED, "repaired: the object repeats"),
        ("```json\n" + json.dumps(GOOD)[:-1] + ', "user_preferences_reasoning": "r"}\n```', REPAIRED, "repaired"),
        (json.dumps(GOOD | {"action": "Add Priya to the list."}), REPAIRED, "repaired: the object holds keys"),
        ('{"agent_notes": "- Use bullet points."}', NOTES_ONLY, "notes only"),
        ('{"user_preferences_reasoning": "  ", "agent_notes": "- Use bullet points."}', NOTES_ONLY, "notes only"),
        ('{"user_preferences_reasoning": "r", "agent_notes": ""}', UNUSABLE, "unusable"),
        ('{"user_preferences_reasoning": "the user likes bullets"}', UNUSABLE, "unusable"),
        ("- Use bullet points.", UNUSABLE, "unusable"),
        ("", UNUSABLE, "unusable"),
    ],
)
def test_credit_levels(reply: str, credit: float, level: str) -> None:
    result = format_reward(reply)
    assert result.score == credit
    assert result.reason.startswith(level)
    assert (result.notes is None) == (level == "unusable")  # a cut reply's notes still reach the judge


def test_levels_are_ordered() -> None:
    assert EXACT > WRAPPED > REPAIRED > NOTES_ONLY > UNUSABLE == CUT == 0.0 and EXACT == 1.0


def test_notes_are_what_the_agent_would_store() -> None:
    assert extract_notes(json.dumps(GOOD)) == "- Use bullet points."
    listed = '{"user_preferences_reasoning": "r", "agent_notes": ["use bullets", "end with a TL;DR"]}'
    assert extract_notes(listed) == "- use bullets\n- end with a TL;DR"  # flattened like the collab agent does
    assert extract_notes("no JSON here") is None


def test_statements_and_tokens() -> None:
    notes = "Preferences:\n- Use bullet points. End with a TL;DR.\n2) Keep it short\n\n* ok"
    assert split_statements(notes) == ["Use bullet points.", "End with a TL;DR.", "Keep it short"]
    assert count_tokens("End with a TL;DR.") == 7  # words and punctuation marks


def test_ground_truth_round_trip_and_errors() -> None:
    truth = GroundTruth(("Put that in bullet points.",), "- Use bullets.", ("bullets",))
    assert GroundTruth.from_obj(truth.to_json()) == truth == GroundTruth.from_obj(truth.to_dict())
    assert GroundTruth.from_obj('{"enforcements": ["a"]}') == GroundTruth(("a",))
    with pytest.raises(ConfigError, match="did you mean 'bullets'"):
        GroundTruth.from_obj({"enforcements": [], "expected": ["bulets"]})
    with pytest.raises(ConfigError, match="not valid JSON"):
        GroundTruth.from_obj("{oops")
    with pytest.raises(ConfigError, match="unknown keys: gold"):
        GroundTruth.from_obj({"enforcements": [], "gold": "x"})
