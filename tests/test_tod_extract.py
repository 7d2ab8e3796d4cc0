"""The deterministic memory writer for released MS-TOD sessions reads what was said, never the confirmation state."""

from __future__ import annotations

from pathlib import Path

import pytest

from memrl.envs.tod.extract import TextExtractor, lexicon_from_sgd
from memrl.envs.tod.formats import LoadProblems, Session, load_individual
from memrl.envs.tod.schema import Schemas, load_schemas

FIXTURES = Path(__file__).parent / "fixtures"
SGD = FIXTURES / "sgd"


@pytest.fixture(scope="module")
def schemas() -> Schemas:
    return load_schemas(SGD)


def session(*turns: str, service: str = "Restaurants", intent: str = "ReserveRestaurant") -> Session:
    """A released-style session: alternating assistant / user turns given as 'A: ...' / 'U: ...'."""
    return Session.model_validate(
        {
            "session_id": 1,
            "reference_dialogue_id": "t",
            "exist_confirmation": False,
            "intent": intent,
            "service": service,
            "turns": [
                {"speaker": "user" if t.startswith("U:") else "assistant", "utterance": t[2:].strip()} for t in turns
            ],
        }
    )


def test_the_confirmation_state_is_never_read(schemas: Schemas) -> None:
    ind = load_individual(FIXTURES / "mstod_release" / "persona_1.json", schemas, LoadProblems())
    confirming = ind.sessions[-1]
    assert confirming.confirmation_state is not None
    facts = TextExtractor(schemas).facts(confirming)
    confirming.confirmation_state.slot_values = {k: "Nowhere Else" for k in confirming.confirmation_state.slot_values}
    assert TextExtractor(schemas).facts(confirming) == facts
    assert "Nowhere Else" not in facts.values()


def test_the_latest_mention_wins(schemas: Schemas) -> None:
    said = session("U: Dinner on March 7th please.", "A: Noted.", "U: Actually, make it March 9th at 8 pm.")
    facts = TextExtractor(schemas).facts(said)
    assert facts["date"] == "March 9th" and facts["time"] == "8 pm"


def test_a_count_needs_the_slots_noun(schemas: Schemas) -> None:
    extract = TextExtractor(schemas).facts
    assert "number_of_seats" not in extract(session("U: My 2 kids love noodles."))
    assert extract(session("A: How many seats should I hold?", "U: Just 2."))["number_of_seats"] == "2"
    assert extract(session("U: A table with four seats, please."))["number_of_seats"] == "4"
    # A clock time is not a count.
    assert extract(session("A: How many seats?", "U: 3, at 6 pm."))["number_of_seats"] == "3"


def test_true_false_slots_are_left_out_and_names_follow_their_preposition(schemas: Schemas) -> None:
    ride = session(
        "U: I need a cab to Union Square for 2 riders, and I'm fine sharing.", service="RideSharing", intent="GetRide"
    )
    facts = TextExtractor(schemas).facts(ride)
    assert facts == {"destination": "Union Square", "number_of_riders": "2"}


def test_the_lexicon_comes_from_the_sgd_dialogues_and_is_looked_for(schemas: Schemas) -> None:
    lexicon = lexicon_from_sgd(SGD)
    assert "Sino" in lexicon[("Restaurants", "restaurant_name")]
    said = session("U: Could you book Sino for tonight?")
    assert TextExtractor(schemas, lexicon).facts(said)["restaurant_name"] == "Sino"
    assert "restaurant_name" not in TextExtractor(schemas).facts(said)  # no preposition cue, no lexicon: not found
