from __future__ import annotations

import pytest

from memrl.rollout import JSONParseFailure, ParsedJSON, parse_json_object


def test_plain_object_is_not_marked_repaired() -> None:
    result = parse_json_object('{"score": 2, "reasoning": "ok"}', required=["score"])
    assert isinstance(result, ParsedJSON)
    assert result.data == {"score": 2, "reasoning": "ok"}
    assert not result.repaired


@pytest.mark.parametrize(
    "text",
    [
        'Sure! Here is my answer:\n```json\n{"score": 3, "reasoning": "covers all"}\n```\nHope it helps.',
        'Reasoning first. {"score": 3, "reasoning": "covers all"} trailing words',
        "{'score': 3, 'reasoning': 'covers all',}",
        '{"score": 3, "reasoning": "covers all"',
    ],
)
def test_object_is_extracted_or_repaired(text: str) -> None:
    result = parse_json_object(text, required=["score", "reasoning"])
    assert isinstance(result, ParsedJSON), result
    assert result.data["score"] == 3
    assert result.data["reasoning"] == "covers all"


def test_repairs_are_flagged() -> None:
    result = parse_json_object("{'score': 1,}")
    assert isinstance(result, ParsedJSON) and result.repaired


@pytest.mark.parametrize("text", ["no json at all", "", "[1, 2, 3]", "{}"])
def test_unrecoverable_output_is_a_typed_failure(text: str) -> None:
    result = parse_json_object(text)
    assert isinstance(result, JSONParseFailure)
    assert not result.ok
    assert result.raw == text


def test_missing_required_key_names_it() -> None:
    result = parse_json_object('{"reasoning": "x"}', required=["score", "reasoning"])
    assert isinstance(result, JSONParseFailure)
    assert "score" in result.reason and "reasoning" not in result.reason.split(":")[-1]
