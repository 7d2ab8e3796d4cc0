"""The deterministic memory writer for released MS-TOD sessions reads what was said, never the confirmation state."""

from __future__ import annotations

import pytest
from support import FIXTURES

from memrl.envs.tod.extract import TextExtractor, folder_schemas, lexicon_from_sgd, slot_phase
from memrl.envs.tod.formats import LoadProblems, Session, load_individual, load_tod_dir
from memrl.envs.tod.schema import Schemas, load_schemas

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


@pytest.fixture(scope="module")
def cars() -> Schemas:
    """RentalCars_1 and _3 (pickup/dropoff and start/end dates), hand-written; restricted as a release folder is."""
    rental = FIXTURES / "mstod_release" / "rental"
    individuals = load_tod_dir(rental, load_schemas(rental / "schema.json"), LoadProblems())
    return folder_schemas(individuals, load_schemas(rental / "schema.json"))


def car(*turns: str) -> Session:
    return session(*turns, service="RentalCars", intent="ReserveCar")


@pytest.mark.parametrize(
    ("turns", "dates"),
    [
        (("U: I need it from March 3rd to March 5th.",), {"pickup_date": "March 3rd", "dropoff_date": "March 5th"}),
        (("U: I'll drop it off the next day, on March 5th.",), {"dropoff_date": "March 5th"}),
        (("A: When will you be returning the car?", "U: March 4th."), {"dropoff_date": "March 4th"}),
        (("A: What date suits you?", "U: March 4th, please."), {"pickup_date": "March 4th"}),
        (
            ("U: Pick it up on March 2nd at 4:45 pm and I'll return it on March 6th.",),
            {"pickup_date": "March 2nd", "dropoff_date": "March 6th", "pickup_time": "4:45 pm"},
        ),
        (("U: Either March 3rd or March 4th works.",), {}),
    ],
)
def test_a_date_goes_to_the_slot_its_wording_names(cars: Schemas, turns: tuple[str, ...], dates: dict) -> None:
    facts = TextExtractor(cars).facts(car(*turns))
    assert {k: v for k, v in facts.items() if "date" in k or "time" in k} == dates


def test_the_phase_of_a_slot_comes_from_its_name() -> None:
    ends = ("dropoff_date", "check_out_date", "end_date", "return_date", "inbound_departure_time")
    starts = ("pickup_date", "check_in_date", "start_date", "departure_date", "outbound_departure_time", "date")
    assert {slot_phase(s) for s in ends} == {"end"} and {slot_phase(s) for s in starts} == {"start"}
