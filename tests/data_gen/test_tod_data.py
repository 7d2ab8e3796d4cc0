"""MS-TOD data from the SGD fixture: goals, plans, the template and LLM writers, memory banks, resume, bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import FIXTURES, MemrlCLI

from memrl.core.errors import MemrlError
from memrl.data_gen.config import TodDataConfig
from memrl.data_gen.tod.dataset import build_tod_dataset, load_source, plan_from
from memrl.data_gen.tod.goals import extract_goals
from memrl.data_gen.tod.plan import IndividualPlan, SessionPlan
from memrl.data_gen.tod.session_writers import MIN_TURNS, LLMWriter, TemplateWriter, Written
from memrl.envs.tod.formats import (
    NEITHER,
    Individual,
    LoadProblems,
    Session,
    file_format,
    load_individual,
    load_tod_dir,
)
from memrl.envs.tod.memory import (
    LLMMemoryBuilder,
    TemplateMemoryBuilder,
    build_memory_bank,
    load_memory_banks,
)
from memrl.envs.tod.reasoning import filled_slots, schema_intent_query, schema_missing_slots
from memrl.envs.tod.schema import Schemas, TodDataError, load_schemas
from memrl.envs.tod.sgd import dialogue_files
from memrl.envs.tod.values import mentions
from memrl.rollout.base import ChatBackend, SamplingParams

SGD = FIXTURES / "sgd"
MSTOD = FIXTURES / "mstod"
RELEASE = FIXTURES / "mstod_release" / "persona_1.json"


@pytest.fixture(scope="module")
def schemas() -> Schemas:
    return load_schemas(SGD)


@pytest.fixture(scope="module")
def plans() -> list[IndividualPlan]:
    return plan_from(load_source(SGD), TodDataConfig(sgd_dir=SGD, individuals=6))


# --- goals ----------------------------------------------------------------------------------------------------------


def test_goals_take_the_last_confirmation(schemas: Schemas) -> None:
    goals = extract_goals(dialogue_files(SGD), schemas)
    assert len(goals) == 42 and all(len(g.slots) >= 2 for g in goals)
    assert {(g.service, g.intent) for g in goals} == {
        ("Restaurants_1", "ReserveRestaurant"),
        ("Restaurants_2", "ReserveRestaurant"),
        ("RideSharing_1", "GetRide"),
    }
    by_id = {g.reference_dialogue_id: g for g in goals}
    changed = 0
    for path in dialogue_files(SGD):
        for dialogue in json.loads(path.read_text()):
            last: dict[str, str] = {}
            first: dict[str, str] = {}
            for turn in dialogue["turns"]:
                for frame in turn["frames"]:
                    for act in frame["actions"]:
                        if act["act"] == "CONFIRM":
                            first.setdefault(act["slot"], act["values"][0])
                            last[act["slot"]] = act["values"][0]
            goal = by_id[f"{path.parent.name}-{dialogue['dialogue_id']}"]
            assert goal.slots == {s: last[s] for s in goal.slots} and set(goal.slots) == set(last)
            changed += first != last
    assert changed >= 3  # the fixture holds users who changed their minds
    # train 1_00002: the time was confirmed as 5:15 pm, then re-confirmed as 5:30 pm after a failed booking.
    goal = by_id["train-1_00002"]
    assert goal.slots["time"] == "5:30 pm" and "5:15 pm" in goal.earlier["time"]
    assert list(goal.slots) == ["restaurant_name", "city", "time", "date", "party_size"]  # schema order


# --- plans ----------------------------------------------------------------------------------------------------------


def test_plan_invariants(plans: list[IndividualPlan]) -> None:
    assert len(plans) == 6
    used = [s.goal.reference_dialogue_id for p in plans for s in p.sessions if s.stage == "confirming"]
    assert len(used) == 36 and len(set(used)) == 36  # 6 tasks each, no goal shared between individuals
    interleaved = 0
    for plan in plans:
        assert [s.session_id for s in plan.sessions] == list(range(1, len(plan.sessions) + 1))
        tasks = plan.tasks()
        assert len(tasks) == 6
        firsts = sorted(ss[0].session_id for ss in tasks.values())
        lasts = sorted(ss[-1].session_id for ss in tasks.values())
        interleaved += any(f < prev_last for f, prev_last in zip(firsts[1:], lasts, strict=False))
        for sessions in tasks.values():
            goal = sessions[0].goal
            stages = [s.stage for s in sessions]
            assert stages in (["incomplete", "updating", "confirming"], ["incomplete", "confirming"])
            if len(goal.slots) == 2:
                assert len(sessions) == 2
            anchor = goal.anchor
            assert all(s.states.get(anchor) == goal.slots[anchor] for s in sessions)  # every session names it
            for slot, value in goal.slots.items():  # every confirmed value was stated before the confirmation
                assert any(s.states.get(slot) == value for s in sessions[:-1]), (slot, value)
            confirming = sessions[-1]
            assert confirming.missing and set(confirming.missing) < set(goal.slots)
            if len(sessions) == 3:
                incomplete, updating = sessions[0], sessions[1]
                for slot, old in updating.corrects.items():
                    assert incomplete.states[slot] == old != goal.slots[slot] == updating.states[slot]
    assert interleaved >= 4  # tasks overlap in time rather than running one after another


def test_plan_is_deterministic_with_a_seed(plans: list[IndividualPlan]) -> None:
    source = load_source(SGD)
    assert plan_from(source, TodDataConfig(sgd_dir=SGD, individuals=6)) == plans
    assert plan_from(source, TodDataConfig(sgd_dir=SGD, individuals=6, seed=1)) != plans


def test_too_few_goals_is_one_line() -> None:
    with pytest.raises(MemrlError, match="8 individuals x 6 tasks need 48 goals, but the SGD files hold 42 goals"):
        plan_from(load_source(SGD), TodDataConfig(sgd_dir=SGD, individuals=8))


# --- written sessions -----------------------------------------------------------------------------------------------


def test_fixture_is_what_the_generator_writes(tmp_path: Path) -> None:
    """The shipped fixture is current: regenerating it gives the same files byte for byte."""
    stats, _ = build_tod_dataset(TodDataConfig(sgd_dir=Path("tests/fixtures/sgd"), individuals=6), tmp_path / "o")
    files = sorted(p.relative_to(MSTOD) for p in MSTOD.rglob("*.json"))
    assert files == sorted(
        p.relative_to(tmp_path / "o") for p in (tmp_path / "o").rglob("*.json") if ".progress" not in p.parts
    )
    for rel in files:
        assert (tmp_path / "o" / rel).read_text() == (MSTOD / rel).read_text(), rel
    assert stats["individuals"] == 6 and stats["min_turns_per_session"] >= MIN_TURNS


def test_template_sessions_state_what_the_plan_says(schemas: Schemas) -> None:
    individuals = load_tod_dir(MSTOD, load_schemas(MSTOD / "schema.json"))
    assert [i.persona_id for i in individuals] == list(range(1, 7))
    for ind in individuals:
        for ref, sessions in ind.tasks().items():
            goal = ind.confirmed(ref)
            assert sessions[-1].confirming and not any(s.exist_confirmation for s in sessions[:-1])
            for session in sessions:
                assert len(session.turns) >= MIN_TURNS
                for turn in session.turns:
                    assert all(mentions(turn.utterance, v) for v in turn.slots.values())
                    assert not turn.slots or turn.speaker == "user"
            confirming = sessions[-1]
            assert confirming.confirmation_state is not None
            confirmation = confirming.turns[confirming.confirmation_state.confirmation_utterance_id]
            assert confirmation.speaker == "assistant" and all(
                mentions(confirmation.utterance, v) for v in goal.values()
            )
            filled = filled_slots(confirming.context())
            assert set(goal) - set(filled)  # memory has something to supply
            for slot, value in goal.items():
                assert any(t.slots.get(slot) == value for s in sessions[:-1] for t in s.turns)


# --- resume ---------------------------------------------------------------------------------------------------------


class Crash(RuntimeError):
    pass


class CrashingWriter(TemplateWriter):
    """Dies while writing its k-th session, like a killed process."""

    def __init__(self, schemas: Schemas, crash_at: int) -> None:
        super().__init__(schemas)
        self.count = 0
        self.crash_at = crash_at

    def write(self, plan: SessionPlan) -> Session:
        self.count += 1
        if self.count == self.crash_at:
            raise Crash(plan.key)
        return super().write(plan)


def test_resume_after_a_crash_matches_an_uninterrupted_run(tmp_path: Path, schemas: Schemas) -> None:
    cfg = TodDataConfig(sgd_dir=SGD, individuals=3, tasks_per_individual=4)
    build_tod_dataset(cfg, tmp_path / "whole")
    out = tmp_path / "resumed"
    with pytest.raises(Crash):
        build_tod_dataset(cfg, out, writer=CrashingWriter(schemas, crash_at=20))  # inside the 2nd individual
    assert (out / "persona_1.json").exists() and not (out / "persona_2.json").exists()
    log = out / ".progress" / "sessions.jsonl"
    with log.open("a") as f:
        f.write('{"key": "2/9", "sess')  # a torn last line, as a kill mid-write leaves it
    _, gen = build_tod_dataset(cfg, out)
    assert gen.skipped_individuals == 1 and gen.resumed_sessions == 19 - len(
        load_individual(out / "persona_1.json").sessions
    )
    keys = [json.loads(line)["key"] for line in log.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == sum(len(load_individual(p).sessions) for p in out.glob("persona_*.json"))
    for path in sorted((tmp_path / "whole").rglob("*.json")):
        rel = path.relative_to(tmp_path / "whole")
        if ".progress" not in rel.parts:
            assert (out / rel).read_text() == path.read_text(), rel
    _, again = build_tod_dataset(cfg, out)  # a finished run is a no-op
    assert again.skipped_individuals == 3 and again.sessions == 0


def test_rerun_with_other_settings_is_refused(tmp_path: Path) -> None:
    build_tod_dataset(TodDataConfig(sgd_dir=SGD, individuals=2, tasks_per_individual=2), tmp_path)
    with pytest.raises(MemrlError, match="tasks_per_individual=2, not 3"):
        build_tod_dataset(TodDataConfig(sgd_dir=SGD, individuals=2, tasks_per_individual=3), tmp_path)


# --- the LLM writer and memory builder with a real (tiny) model -------------------------------------------------


@pytest.fixture(scope="module")
def tiny_backend(tiny_qwen2: str) -> ChatBackend:
    from memrl.rollout.hf_local import HFBackend

    return HFBackend(tiny_qwen2)


def test_llm_writer_retries_then_falls_back(
    tiny_backend: ChatBackend, plans: list[IndividualPlan], schemas: Schemas
) -> None:
    writer = LLMWriter(tiny_backend, schemas, SamplingParams(temperature=0.0, max_tokens=16, seed=0))
    chosen = [plans[0].sessions[0], next(s for s in plans[0].sessions if s.stage == "confirming")]
    before = tiny_backend.usage.requests
    written: list[Written] = list(writer.write_many(chosen))
    assert tiny_backend.usage.requests - before == 4  # two tries per session
    assert writer.fallbacks == 2 and sum(writer.failure_reasons.values()) == 4
    template = TemplateWriter(schemas)
    assert [w for w in written] == [(template.write(p), True) for p in chosen]


def test_llm_writer_accepts_a_reply_that_states_the_plan(plans: list[IndividualPlan], schemas: Schemas) -> None:
    """The checks on a model's reply, on replies written by hand."""
    confirming = next(s for s in plans[0].sessions if s.stage == "confirming")
    anchor = confirming.goal.anchor
    name = confirming.states[anchor]
    writer = LLMWriter(None, schemas)  # type: ignore[arg-type]  # parse needs no backend

    def reply(*turns: tuple[str, str]) -> str:
        return "Sure!\n```json\n" + json.dumps({"turns": [{"speaker": s, "utterance": u} for s, u in turns]}) + "\n```"

    extra = {s: v for s, v in confirming.states.items() if s != anchor}
    said = " ".join(extra.values())
    good = reply(
        ("user", f"Let's finish my booking at {name}. {said}"), ("assistant", "Sure, one moment."), ("user", "Thanks.")
    )
    session = writer.parse(confirming, good)
    assert isinstance(session, Session) and session.confirming
    assert session.turns[0].slots == dict(confirming.states)
    assert session.confirmation_state is not None and session.confirmation_state.confirmation_utterance_id == 3
    assert session.confirmation_state.slot_values == confirming.goal.slots
    leaked = confirming.goal.slots[confirming.missing[0]]
    bad = reply(("user", f"Booking at {name}, {said} and {leaked}."), ("assistant", "Okay."), ("user", "Thanks."))
    assert writer.parse(confirming, bad) == "leaked value"
    assert (
        writer.parse(confirming, reply(("user", "Hi"), ("assistant", "Hello"), ("user", "Book it"))) == "missing value"
    )
    assert writer.parse(confirming, "no json here") == "unparsed"


def test_llm_memory_builder_falls_back_per_session(tiny_backend: ChatBackend, schemas: Schemas) -> None:
    ind = load_individual(MSTOD / "persona_1.json")
    small = Individual(persona_id=ind.persona_id, sessions=ind.sessions[:2])
    builder = LLMMemoryBuilder(tiny_backend, SamplingParams(temperature=0.0, max_tokens=16, seed=0))
    bank = build_memory_bank(small, schemas, builder)
    assert builder.failures == 2
    assert bank == build_memory_bank(small, schemas, TemplateMemoryBuilder())


def test_llm_memory_builder_checks_slots_and_answers(schemas: Schemas) -> None:
    ind = load_individual(RELEASE)
    session = ind.sessions[0]
    builder = LLMMemoryBuilder(None)  # type: ignore[arg-type]
    pair = {"slot": "location", "question": "Where?", "answer": "Emeryville"}
    ok = json.dumps({"intent_description": "dinner at Hong Kong East Ocean", "qa_pairs": [pair]})
    unit = builder.parse(ind, session, schemas, ok)
    assert unit is not None and unit.qa[0].answer == "Emeryville" and unit.intent_description.startswith("dinner")
    assert builder.parse(ind, session, schemas, ok.replace('"location"', '"parking"')) is None  # unknown slot
    assert builder.parse(ind, session, schemas, ok.replace("Emeryville", "Oakland")) is None  # not in the dialogue


# --- the released format ----------------------------------------------------------------------------------------------


def test_released_format_loads_and_memory_comes_from_the_words(schemas: Schemas) -> None:
    assert file_format(RELEASE) == "mstod" and file_format(SGD / "dev" / "dialogues_001.json") == "sgd"
    problems = LoadProblems()
    ind = load_individual(RELEASE, schemas, problems)
    assert [d["slot"] for d in problems.dropped_slots] == ["number_of_seats"]  # foreign to the ride's service
    assert [s.session_id for s in ind.sessions] == [1, 2, 3, 4, 5]
    assert all(not t.slots for s in ind.sessions for t in s.turns) and all(s.stage is None for s in ind.sessions)
    tasks = ind.tasks()
    assert list(tasks) == ["4_00021", "11_00054"] and [len(v) for v in tasks.values()] == [3, 2]
    final = tasks["4_00021"][-1]
    goal = ind.confirmed("4_00021")
    assert len(final.context()) == 3 and goal["date"] == "March 8th"
    assert filled_slots(final.context(), goal) == {"restaurant_name": "Hong Kong East Ocean"}
    intent = schemas.intent(final.service, final.intent)  # the family's: Restaurants_1 and _2 slots together
    missing = schema_missing_slots(final.context(), intent, goal)
    assert missing == ["city", "time", "location", "date", "party_size", "number_of_seats"]
    query = schema_intent_query(final.context(), final.service, final.intent, schemas, goal)
    assert query == "reserve a table at a restaurant; name of the restaurant Hong Kong East Ocean"
    banks = load_memory_banks(RELEASE.parent, [ind], schemas)  # no memory/ folder: built offline
    first = banks[1].units[0]
    # What the first session said, the preliminary "March 7th" included; "in Emeryville" fits both place slots.
    assert {p.slot: p.answer for p in first.qa} == {
        "restaurant_name": "Hong Kong East Ocean",
        "city": "Emeryville",
        "location": "Emeryville",
        "date": "March 7th",
        "number_of_seats": "4",
    }
    later = {p.slot: p.answer for p in banks[1].units[2].qa}
    assert later["date"] == "March 8th" and later["time"] == "7:30 pm"
    assert [u.session_id for u in banks[1].before(5)] == [1, 2, 3, 4]


# --- bad input, through the CLI -------------------------------------------------------------------------------------


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memrl: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _first_confirming(data: dict[str, Any]) -> int:
    return next(i for i, s in enumerate(data["sessions"]) if s["exist_confirmation"])


@pytest.mark.parametrize("problem", ["no turns", "unknown slot", "no intent"])
def test_bad_individual_is_one_line(tmp_path: Path, problem: str, memrl_cli: MemrlCLI) -> None:
    data = json.loads((MSTOD / "persona_1.json").read_text())
    c = _first_confirming(data)
    if problem == "no turns":
        data["sessions"][2]["turns"] = []
        fragments: tuple[str, ...] = ("persona_1.json: sessions[2].turns: a session needs at least one turn",)
    elif problem == "unknown slot":
        data["sessions"][c]["confirmation_state"]["slot_values"]["parking"] = "yes"
        service = data["sessions"][c]["service"]
        fragments = (f"persona_1.json: sessions[{c}].confirmation_state.slot_values.parking", service)
    else:
        del data["sessions"][0]["intent"]
        fragments = ("persona_1.json: sessions[0].intent: Field required",)
    (tmp_path / "tod").mkdir()
    (tmp_path / "tod" / "persona_1.json").write_text(json.dumps(data))
    schema = MSTOD / "schema.json"
    result = memrl_cli(
        "data", "judger", "--tod-dir", tmp_path / "tod", "--out", tmp_path / "j", "--schema", schema, "--strict",
        timeout=120,
    )  # fmt: skip
    assert_one_line_error(result, *fragments)


def test_file_in_neither_format_is_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    (tmp_path / "tod").mkdir()
    (tmp_path / "tod" / "persona_1.json").write_text('{"persona": 1, "dialogues": []}')
    result = memrl_cli(
        "data", "judger", "--tod-dir", tmp_path / "tod", "--out", tmp_path / "j", "--schema", MSTOD / "schema.json",
        timeout=120,
    )  # fmt: skip
    assert_one_line_error(result, "persona_1.json", NEITHER)
    sgd = tmp_path / "sgd"
    sgd.mkdir()
    (sgd / "schema.json").write_text((SGD / "train" / "schema.json").read_text())
    (sgd / "dialogues_001.json").write_text((MSTOD / "persona_1.json").read_text())
    result = memrl_cli("data", "tod", "--sgd-dir", sgd, "--individuals", "1", "--out", tmp_path / "o", timeout=120)
    assert_one_line_error(result, "dialogues_001.json", "an MS-TOD individual, not SGD dialogues")


def test_sgd_slot_missing_from_the_schema_is_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    sgd = tmp_path / "sgd"
    sgd.mkdir()
    schema = json.loads((SGD / "train" / "schema.json").read_text())
    schema[0]["slots"] = [s for s in schema[0]["slots"] if s["name"] != "party_size"]
    schema[0]["intents"][0]["optional_slots"].pop("party_size", None)
    schema[0]["intents"][1]["optional_slots"].pop("party_size", None)
    (sgd / "schema.json").write_text(json.dumps(schema))
    (sgd / "dialogues_001.json").write_text((SGD / "train" / "dialogues_001.json").read_text())
    result = memrl_cli("data", "tod", "--sgd-dir", sgd, "--individuals", "1", "--out", tmp_path / "o", timeout=120)
    assert_one_line_error(
        result, "dialogues_001.json", ".slot: no slot 'party_size' in the schema of service Restaurants_1"
    )


def test_data_tod_command_writes_the_layout(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    result = memrl_cli(
        "data", "tod", "--sgd-dir", SGD, "--individuals", "2", "--tasks-per-individual", "3", "--out", tmp_path,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["individuals"] == 2 and summary["tasks"] == 6 and summary["writer_fallbacks"] == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "persona_1.json",
        "persona_2.json",
        "schema.json",
        "stats.json",
    ]
    assert sorted(p.name for p in (tmp_path / "memory").iterdir()) == ["persona_1.json", "persona_2.json"]
    used = {s.service for i in load_tod_dir(tmp_path) for s in i.sessions}
    assert set(load_schemas(tmp_path / "schema.json").services) == used


# --- the release as published: bare service names, foreign slots, files that do not parse ---------------------------


def test_bare_service_names_resolve_to_the_merged_family(schemas: Schemas) -> None:
    assert "Restaurants" in schemas and "Restaurants" not in schemas.services  # looked up, never generated from
    family = schemas.service("Restaurants")
    assert {"party_size", "city"} <= family.slots.keys() and {"number_of_seats", "location"} <= family.slots.keys()
    assert schemas.has_slot("RideSharing", "number_of_riders") and not schemas.has_slot("RideSharing", "city")
    assert schemas.subset(["Restaurants"]).to_records()[0]["service_name"] == "Restaurants"
    with pytest.raises(TodDataError, match="did you mean 'Restaurants'"):
        schemas.service("Restaurant")
    # One file, or an SGD folder with train/dev/test schemas merged.
    assert set(load_schemas(SGD / "train" / "schema.json").services) == {"Restaurants_1"}
    assert set(load_schemas(SGD).services) == {"Restaurants_1", "Restaurants_2", "RideSharing_1"}


def test_lenient_folder_load_drops_foreign_slots_and_skips_bad_files(schemas: Schemas, tmp_path: Path) -> None:
    for path in RELEASE.parent.glob("persona_*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "persona_7.json").write_text("{not json")
    problems = LoadProblems()
    individuals = load_tod_dir(tmp_path, schemas, problems)
    assert [i.persona_id for i in individuals] == [1, 2]
    ride = individuals[0].sessions[3]
    assert ride.confirmation_state is not None and "number_of_seats" not in ride.confirmation_state.slot_values
    assert len(ride.confirmation_state.slot_values) == 3  # the rest of the session is kept
    summary = problems.summary()
    assert summary["dropped_slots"]["count"] == 1 and summary["skipped_files"]["count"] == 1
    dropped = summary["dropped_slots"]["slots"][0]
    assert dropped == {
        "file": str(tmp_path / "persona_1.json"),
        "session_id": 4,
        "service": "RideSharing",
        "slot": "number_of_seats",
        "where": "confirmation_state.slot_values.number_of_seats",
    }
    skipped = summary["skipped_files"]["files"][0]
    assert skipped["file"] == str(tmp_path / "persona_7.json") and "not valid JSON" in skipped["error"]
    with pytest.raises(TodDataError, match=r"persona_1\.json: sessions\[3\]\.confirmation_state"):
        load_tod_dir(tmp_path, schemas)  # strict: the first problem fails the folder


UNSCORED = FIXTURES / "mstod_unscored"  # a whole goal of another service's slots; a confirmation id on a user turn


def test_sessions_that_cannot_be_scored_are_named_and_kept_as_memory() -> None:
    schemas = load_schemas(UNSCORED / "schema.json")
    problems = LoadProblems()
    individuals = {i.persona_id: i for i in load_tod_dir(UNSCORED, schemas, problems)}
    sessions = {s.session_id: s for s in individuals[7].sessions}
    assert [s.session_id for s in individuals[7].sessions] == [1, 2, 3, 4]  # kept: their turns are still memory
    assert [k for k, s in sessions.items() if s.confirming] == [2, 3, 4]
    assert [k for k, s in sessions.items() if s.scored] == [3]
    assert all(s.scored for s in individuals[8].sessions if s.confirming)
    unscored = problems.summary()["unscored_sessions"]
    assert unscored["count"] == 2
    file = str(UNSCORED / "persona_7.json")
    assert [(u["file"], u["session_id"]) for u in unscored["sessions"]] == [(file, 2), (file, 4)]
    assert "another service" in unscored["sessions"][0]["why"]
    assert "confirmation_utterance_id 4 is a user turn" in unscored["sessions"][1]["why"]
    assert problems.summary()["dropped_slots"]["count"] == 2  # beside the slots dropped to empty session 2


def test_strict_load_stops_at_a_confirmation_on_a_user_turn(tmp_path: Path) -> None:
    schemas = load_schemas(UNSCORED / "schema.json")
    record = json.loads((UNSCORED / "persona_7.json").read_text())
    del record["sessions"][1]  # the foreign-slot session fails a strict load first
    (tmp_path / "persona_7.json").write_text(json.dumps(record))
    with pytest.raises(TodDataError) as err:
        load_tod_dir(tmp_path, schemas)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'persona_7.json'}: sessions[2]")
    assert "session_id 4" in message and "confirmation_state.confirmation_utterance_id" in message
    problems = LoadProblems()
    (tmp_path / "persona_9.json").write_text("{broken")
    load_tod_dir(tmp_path, schemas, problems)  # a skipped file leaves nothing of its own behind
    assert problems.summary()["unscored_sessions"]["count"] == 1
