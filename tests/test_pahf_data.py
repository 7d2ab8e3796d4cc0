"""PAHF data: loaders on our fixtures, the gold rule, the rule-based user's feedback through the CLI, embodied gold."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import MemrlCLI
from typer.testing import CliRunner

from memrl.app.cli.main import app
from memrl.envs.pahf.embodied import embodied_feedback, embodied_task
from memrl.envs.pahf.formats import (
    PahfDataError,
    ShoppingData,
    load_embodied,
    load_embodied_dir,
    load_persona_tables,
    load_shopping_dir,
    load_shopping_phase,
)
from memrl.envs.pahf.shopping import acceptable, feature_status, gold, rule_feedback

FIXTURES = Path(__file__).parent / "fixtures" / "pahf"
SHOP = FIXTURES / "shopping"
ORIGINAL = SHOP / "persona_info.json"
UPDATED = SHOP / "updated_persona_info.json"
EMBODIED = FIXTURES / "embodied"


@pytest.fixture(scope="module")
def shop() -> ShoppingData:
    return load_shopping_dir(SHOP)


# --- loaders --------------------------------------------------------------------------------------------------------


def test_shopping_folder_loads(shop: ShoppingData) -> None:
    assert {p: len(rows) for p, rows in shop.phases.items()} == {1: 6, 2: 3, 3: 6, 4: 3}
    first = shop.phases[1][0]
    assert first.product == "desk lamp" and first.user == "Mira" and first.gt == "A"
    assert first.options["C"] == ["fluorescent tube", "gooseneck arm", "touch dimmer"]
    assert shop.phases[1][1].gt is None  # null in the file: buy nothing
    assert set(shop.original) == set(shop.evolved) == set(shop.personas_original) == {"Mira", "Tomas"}
    lamp = shop.original["Mira"].products["desk lamp"]["arm design"]
    assert lamp.like_most == "gooseneck arm" and lamp.dislike == ["fixed stem", "telescoping pole"]
    assert shop.evolved["Mira"].products["desk lamp"]["arm design"].like_most == "clamp mount"
    assert "preferences have changed" in shop.personas_evolved["Mira"]
    assert shop.table(2, "Mira") is shop.original["Mira"] and shop.table(3, "Mira") is shop.evolved["Mira"]
    # learning phases share their rows across the drift; only the gold moves
    assert [r.options for r in shop.phases[1]] == [r.options for r in shop.phases[3]]


def test_records_round_trip() -> None:
    raw = json.loads((SHOP / "phase3.json").read_text())
    assert [s.to_record() for s in load_shopping_phase(SHOP / "phase3.json")] == raw
    tables = json.loads(ORIGINAL.read_text())
    assert {n: t.to_record() for n, t in load_persona_tables(ORIGINAL).items()} == tables


def test_embodied_folder_loads() -> None:
    data = load_embodied_dir(EMBODIED)
    assert len(data.original) == len(data.evolved) == 6
    assert data.original[1].user_intent_location == "fridge door" and not data.original[1].is_pickup
    assert data.evolved[1].user_intent_location == "top shelf"
    assert set(data.personas_original) == set(data.personas_evolved) == {"Rowan", "Juno"}
    tests = load_embodied_dir(EMBODIED, "B")  # the held-out set phases 2 and 4 test on
    assert len(tests.original) == len(tests.evolved) == 6
    assert {s.task for s in tests.original}.isdisjoint({s.task for s in data.original})
    assert tests.evolved[0].user_intent_object == "orange juice" != tests.original[0].user_intent_object


# --- the gold rule --------------------------------------------------------------------------------------------------


def test_gold_reproduces_every_fixture_gt(shop: ShoppingData) -> None:
    for phase, rows in shop.phases.items():
        for row in rows:
            assert gold(shop.table(phase, row.user), row) == (row.gt or "D"), (phase, row)


def test_acceptance_is_conjunctive(shop: ShoppingData) -> None:
    mira, row = shop.original["Mira"], shop.phases[1][0]
    assert feature_status(mira, "desk lamp", "LED panel") == "like_most"
    assert feature_status(mira, "desk lamp", "halogen bulb") == "like_second"
    assert feature_status(mira, "desk lamp", "fluorescent tube") == "dislike"
    assert feature_status(mira, "desk lamp", "lava lamp") == "unknown"
    assert acceptable(mira, row, "A") and acceptable(mira, row, "B")
    assert not acceptable(mira, row, "C")  # two liked features do not outweigh one disliked
    # B and A are both acceptable with no like-most value each: the earlier label wins the tie
    assert gold(mira, shop.phases[1][2]) == "A"


# --- the rule-based user, through the CLI ---------------------------------------------------------------------------


def feedback(*args: str | Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["pahf", "feedback", *map(str, args)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"correct", "message", "kind"}
    return out


# (table, scenario, choice, style, original table or None, correct, kind, words in the message, words NOT in it)
CASES = [
    ("orig", "phase1.json:0", "A", "minimal", None, True, "right", [], []),
    ("orig", "phase1.json:1", "D", "minimal", None, True, "right", ["not buying"], []),
    # buying nothing when an option fit: minimal does not say which, detailed names the gold
    ("orig", "phase1.json:0", "D", "minimal", None, False, "buy_nothing_but_fit", ["bought nothing"], ["option A"]),
    ("orig", "phase1.json:0", "D", "detailed", None, False, "buy_nothing_but_fit", ["option A", "LED panel"], []),
    # a disliked feature: only the offending value; detailed adds the favourite of that feature
    ("orig", "phase1.json:0", "C", "minimal", None, False, "disliked", ["fluorescent tube"], ["gooseneck", "LED"]),
    ("orig", "phase1.json:0", "C", "detailed", None, False, "disliked", ["fluorescent tube", "LED panel"], ["dimmer"]),
    ("orig", "phase1.json:3", "A", "minimal", None, False, "disliked", ["OLED strip"], ["fixed stem", "pull chain"]),
    ("orig", "phase1.json:3", "A", "detailed", None, False, "disliked", ["OLED strip", "halogen bulb"], ["fixed"]),
    # acceptable, not preferred
    ("orig", "phase1.json:0", "B", "minimal", None, False, "acceptable_not_preferred", ["acceptable"], ["option A"]),
    ("orig", "phase1.json:0", "B", "detailed", None, False, "acceptable_not_preferred", ["option A", "LED panel"], []),
    ("orig", "phase1.json:2", "B", "detailed", None, False, "acceptable_not_preferred", ["option A"], []),
    # after the drift: right under the old table, wrong now
    ("upd", "phase3.json:0", "A", "minimal", "orig", False, "drift", ["preferences have changed", "gooseneck arm"], []),
    ("upd", "phase3.json:0", "A", "detailed", "orig", False, "drift", ["changed", "clamp mount"], ["LED panel"]),
    ("upd", "phase3.json:5", "D", "detailed", "orig", False, "drift", ["changed", "option A"], []),
    ("upd", "phase3.json:4", "A", "minimal", "orig", False, "drift", ["changed", "cast iron"], []),
    # without the old table there is no drift message; a choice wrong under both tables is no drift either
    ("upd", "phase3.json:0", "A", "minimal", None, False, "disliked", ["gooseneck arm"], ["changed"]),
    ("upd", "phase3.json:0", "C", "minimal", "orig", False, "disliked", ["fluorescent tube"], ["changed"]),
    ("upd", "phase3.json:0", "B", "minimal", "orig", True, "right", [], []),
]


@pytest.mark.parametrize(("table", "scenario", "choice", "style", "original", "correct", "kind", "has", "lacks"), CASES)
def test_feedback_rules(
    table: str,
    scenario: str,
    choice: str,
    style: str,
    original: str | None,
    correct: bool,
    kind: str,
    has: list[str],
    lacks: list[str],
) -> None:
    tables = {"orig": ORIGINAL, "upd": UPDATED}
    args: list[str | Path] = ["--persona-table", tables[table], "--scenario", f"{SHOP / scenario}"]
    args += ["--choice", choice, "--style", style]
    if original:
        args += ["--original-table", tables[original]]
    out = feedback(*args)
    assert (out["correct"], out["kind"]) == (correct, kind), out
    for word in has:
        assert word in out["message"], out
    for word in lacks:
        assert word not in out["message"], out


def test_feedback_from_a_scenario_file_and_another_user(tmp_path: Path) -> None:
    row = json.loads((SHOP / "phase1.json").read_text())[0]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(row))
    assert feedback("--persona-table", ORIGINAL, "--scenario", path, "--choice", "A")["kind"] == "right"
    # Tomas dislikes the clamp mount of B, and A is acceptable to him too
    out = feedback("--persona-table", ORIGINAL, "--scenario", path, "--choice", "B", "--user", "Tomas")
    assert out["kind"] == "disliked" and "clamp mount" in out["message"]


def test_drifted_needs_the_original_table(shop: ShoppingData) -> None:
    with pytest.raises(ValueError, match="original"):
        rule_feedback(shop.evolved["Mira"], shop.phases[3][0], "A", drifted=True)
    out = rule_feedback(shop.evolved["Mira"], shop.phases[3][0], "A", drifted=True, original=shop.original["Mira"])
    assert out.kind == "drift"


# --- bad input: one line, exit 2 ------------------------------------------------------------------------------------


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memrl: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _bad_files(tmp: Path) -> dict[str, Path]:
    rows = json.loads((SHOP / "phase1.json").read_text())
    no_options = {k: v for k, v in rows[0].items() if not k.startswith("Option")}
    no_user = {k: v for k, v in rows[0].items() if k != "User"}
    tables = json.loads(ORIGINAL.read_text())
    del tables["Tomas"]["persona_info"]["kettle"]["spout shape"]["like_most"]
    files = {
        "no_options": [rows[1], no_options],
        "no_user": no_user,
        "tables": tables,
        "not_tables": ["Mira", "Tomas"],
        "two_options": {k: v for k, v in rows[0].items() if k != "Option C"},
    }
    out = {}
    for name, data in files.items():
        out[name] = tmp / f"{name}.json"
        out[name].write_text(json.dumps(data))
    return out


@pytest.mark.parametrize(
    ("table", "scenario", "choice", "fragments"),
    [
        ("orig", "no_options.json:1", "A", ["no_options.json", "[1].Option A/B/C"]),
        ("orig", "no_user.json", "A", ["no_user.json", "User: missing"]),
        ("tables", "phase1", "A", ["tables.json", "Tomas.persona_info.kettle.spout shape.like_most: missing"]),
        ("not_tables", "phase1", "A", ["not_tables.json", "unknown format"]),
        ("orig", "two_options.json", "C", ["choice 'C'", "A, B, D"]),
        ("orig", "phase1_far", "A", ["phase1.json", "no row 99"]),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, table: str, scenario: str, choice: str, fragments: list[str], memrl_cli: MemrlCLI
) -> None:
    bad = _bad_files(tmp_path)
    tables = {"orig": ORIGINAL, "tables": bad["tables"], "not_tables": bad["not_tables"]}
    scenarios = {"phase1": f"{SHOP / 'phase1.json'}:0", "phase1_far": f"{SHOP / 'phase1.json'}:99"}
    spec = scenarios.get(scenario) or str(tmp_path / scenario)
    result = memrl_cli(
        "pahf", "feedback", "--persona-table", tables[table], "--scenario", spec, "--choice", choice, timeout=60
    )
    assert_one_line_error(result, *fragments)


def test_bad_embodied_file_names_the_field(tmp_path: Path) -> None:
    rows = json.loads((EMBODIED / "scenarios" / "original_scenarios_A.json").read_text())
    del rows[2]["user_intent_object"]
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(PahfDataError, match=r"scenarios\.json: \[2\]\.user_intent_object: missing"):
        load_embodied(path)
    path.write_text(json.dumps({"index": 0}))
    with pytest.raises(PahfDataError, match="unknown format"):
        load_embodied(path)


# --- embodied options and gold --------------------------------------------------------------------------------------


def test_embodied_gold_from_the_scenario() -> None:
    rows = load_embodied(EMBODIED / "scenarios" / "original_scenarios_A.json")
    pickup = embodied_task(rows[0], seed=0)
    assert sorted(o.object for o in pickup.options) == sorted(rows[0].scene_objects)
    assert pickup.gold is not None and pickup.option(pickup.gold).object == "green tea"
    assert all(o.location is None for o in pickup.options)

    place = embodied_task(rows[1], seed=0)
    assert sorted(o.location or "" for o in place.options) == ["counter", "fridge door", "top shelf"]
    assert place.gold is not None and place.option(place.gold).location == "fridge door"
    assert "put the yogurt at the fridge door" in place.render()

    missing_place = embodied_task(rows[4], seed=0)  # the intended place is not listed but there is room for it
    assert missing_place.gold is not None and missing_place.option(missing_place.gold).location == "meeting table"
    assert embodied_task(rows[5], seed=0).gold is None  # the intended object is not in the scene


def test_embodied_order_is_seeded() -> None:
    rows = load_embodied(EMBODIED / "scenarios" / "original_scenarios_A.json")
    orders = {seed: [embodied_task(s, seed=seed).options for s in rows] for seed in range(4)}
    assert orders[0] == [embodied_task(s, seed=0).options for s in rows]
    assert len({json.dumps([[o.object for o in opts] for opts in order]) for order in orders.values()}) > 1
    # the gold moves with the options: always the intended object
    for seed in orders:
        task = embodied_task(rows[3], seed=seed)
        assert task.gold is not None and task.option(task.gold).object == "espresso"


def test_embodied_feedback_from_the_gold() -> None:
    rows = load_embodied(EMBODIED / "scenarios" / "evolved_scenarios_A.json")
    task = embodied_task(rows[0], seed=1)
    assert task.gold is not None
    assert embodied_feedback(task, task.gold).correct
    wrong = next(o.label for o in task.options if o.label != task.gold)
    out = embodied_feedback(task, wrong, style="detailed")
    assert not out.correct and "orange juice" in out.message and "general preference" in out.message
    place = embodied_task(rows[1], seed=1)
    wrong = next(o.label for o in place.options if o.label != place.gold)
    assert "top shelf" in embodied_feedback(place, wrong).message
    with pytest.raises(PahfDataError, match="no gold"):
        embodied_feedback(embodied_task(rows[5]), "A")
