"""One value comparison for memory, labels, facts and metrics; dates stored under the slot their wording names; a
released folder's schema holds only the slots its confirmations use."""

from __future__ import annotations

import pytest
from support import FIXTURES

from memrl.envs.tod.extract import folder_schemas, used_slots
from memrl.envs.tod.formats import Individual, LoadProblems, load_tod_dir
from memrl.envs.tod.labels import label
from memrl.envs.tod.memory import MemoryBank, TemplateMemoryBuilder, load_memory_banks, memory_coverage
from memrl.envs.tod.metrics import slot_correctness
from memrl.envs.tod.ranking import fact_of
from memrl.envs.tod.schema import Schemas, load_schemas
from memrl.envs.tod.values import mentions, normalise_value, same_value

RENTAL = FIXTURES / "mstod_release" / "rental"  # RentalCars_1 + _3 merged, Hotels_1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("5:30 pm", "5:30 PM."),
        ("two", "2"),
        ("2 rooms", "2"),
        ("one room", "1"),
        ("4 people", "four"),
        ("the Drums", "Drums"),
        ("Cher's", "Cher"),
        ("March 3rd", "march 3"),
        ("7:00 pm", "7 pm"),
        ("6 p.m.", "6pm"),
    ],
)
def test_one_value_in_other_words_is_the_same_value(a: str, b: str) -> None:
    assert same_value(a, b)
    assert fact_of("slot", a) == fact_of("slot", b)


@pytest.mark.parametrize(
    ("a", "b"),
    [("12", "2"), ("March 3rd", "March 4th"), ("6 pm", "6"), ("Five Guys", "5"), ("Economy", "Premium Economy")],
)
def test_values_that_differ_stay_apart(a: str, b: str) -> None:
    assert not same_value(a, b)
    assert fact_of("slot", a) != fact_of("slot", b)


def test_a_text_mentions_a_value_in_any_of_its_wordings() -> None:
    assert mentions("Booked two rooms for you.", "2 rooms")
    assert mentions("A table at Drums, 7 pm.", "the Drums")
    assert not mentions("Room 12 is yours.", "2")
    assert normalise_value("  The  Velvet Inn. ") == "velvet inn"
    goal = {"number_of_rooms": "two rooms", "hotel_name": "the Velvet Lantern Inn"}
    assert slot_correctness("2 rooms at Velvet Lantern Inn are held.", goal) == dict.fromkeys(goal, True)


def test_a_stored_number_the_user_said_in_words_is_a_positive_not_superseded() -> None:
    ind = _folder()[0]
    query = ind.sessions[-1]  # the hotel confirmation: gold "two rooms", "the Velvet Lantern Inn", "three"
    goal = query.confirmation_state.slot_values  # type: ignore[union-attr]
    for slot, stored in (("number_of_rooms", "2"), ("hotel_name", "Velvet Lantern Inn"), ("number_of_days", "3")):
        assert label(query, goal, {}, query.reference_dialogue_id, query.intent, slot, stored) is None
    assert label(query, goal, {}, query.reference_dialogue_id, query.intent, "number_of_rooms", "3") == "superseded"


def _folder() -> list[Individual]:
    return load_tod_dir(RENTAL, load_schemas(RENTAL / "schema.json"), LoadProblems())


def _banks(individuals: list[Individual], schemas: Schemas) -> dict[int, MemoryBank]:
    return load_memory_banks(RENTAL / "no-memory", individuals, schemas, TemplateMemoryBuilder())


def test_a_released_folder_keeps_only_the_slots_its_confirmations_use() -> None:
    individuals = _folder()
    merged = load_schemas(RENTAL / "schema.json")
    assert {"start_date", "end_date", "car_type"} <= set(merged.service("RentalCars").slots)
    schemas = folder_schemas(individuals, merged)
    cars = schemas.service("RentalCars")
    assert (
        set(cars.slots)
        == used_slots(individuals)["RentalCars"]
        == {
            "pickup_location",
            "pickup_date",
            "pickup_time",
            "dropoff_date",
            "type",
        }
    )
    assert cars.intents["ReserveCar"].slots == ("pickup_location", "pickup_date", "pickup_time", "dropoff_date", "type")
    assert set(merged.service("RentalCars").slots) > set(cars.slots)  # the loaded schema is left as it was
    stored = {p.slot for u in _banks(individuals, schemas)[3].units for p in u.qa}
    assert not stored & {"start_date", "end_date", "car_type"}


def test_an_annotated_folder_keeps_the_merged_schema() -> None:
    individuals = _folder()
    individuals[0].sessions[0].turns[0].slots["pickup_date"] = "March 3rd"
    merged = load_schemas(RENTAL / "schema.json")
    assert folder_schemas(individuals, merged) is merged


def test_each_date_goes_to_the_slot_its_wording_names_and_every_confirmed_value_is_held() -> None:
    individuals = _folder()
    banks = _banks(individuals, folder_schemas(individuals, load_schemas(RENTAL / "schema.json")))
    units = {u.session_id: {p.slot: p.answer for p in u.qa} for u in banks[3].units}
    assert units[1]["pickup_date"] == "March 3rd" and "dropoff_date" not in units[1]  # "when ... pick it up?"
    assert units[3]["dropoff_date"] == "March 6th" and "pickup_date" not in units[3]  # "dropping it off on"
    coverage = memory_coverage(individuals, banks)
    assert coverage["held"] == coverage["gold_facts"] == 10
    assert coverage["superseded_pairs"] == 0
