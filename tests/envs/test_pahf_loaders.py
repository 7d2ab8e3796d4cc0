"""PAHF data: loaders on our fixtures, the gold rule, the rule-based user's feedback through the CLI, embodied gold."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import FIXTURES, MemrlCLI
from typer.testing import CliRunner

from memrl.app.cli.main import app
from memrl.envs.pahf.embodied import embodied_feedback, embodied_task
from memrl.envs.pahf.formats import (
    PahfDataError,
    ShoppingData,
    ShoppingScenario,
    load_embodied,
    load_embodied_dir,
    load_persona_tables,
    load_personas,
    load_shopping_dir,
    load_shopping_phase,
    read_literal_module,
)
from memrl.envs.pahf.shopping import acceptable, changed_values, feature_status, gold, rule_feedback

FIXTURES = FIXTURES / "pahf"
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
    # buying nothing has no feature that could have drifted, even where nothing fit under the old table
    ("upd", "phase3.json:5", "D", "detailed", "orig", False, "buy_nothing_but_fit", ["option A"], ["changed"]),
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


# Hand-built Mira desk-lamp rows that tell the harness's drift rule (acceptable under the old table AND a value once
# liked is now disliked) from "the choice was the old answer". Mira's arm design drifts: gooseneck arm goes from liked
# most to disliked, telescoping pole from disliked to liked second, clamp mount becomes the favourite.
LAMP = "desk lamp"
DRIFT_ROWS = {
    # B is acceptable under the old table and has the now-disliked gooseneck arm, but the old answer was A
    "acceptable_then": {
        "A": ["LED panel", "gooseneck arm", "touch dimmer"],
        "B": ["halogen bulb", "gooseneck arm", "rocker switch"],
        "C": ["halogen bulb", "clamp mount", "rocker switch"],
    },
    # A was the old answer (a tie on like-most values, earliest label) but nothing in it drifted: B wins now
    "old_answer": {
        "A": ["halogen bulb", "spring-balanced arm", "rocker switch"],
        "B": ["OLED strip", "clamp mount", "rotary dimmer"],
    },
    # nothing fitted under the old table (D was the old answer); the telescoping pole is acceptable now
    "old_nothing": {"A": ["LED panel", "telescoping pole", "touch dimmer"]},
}


def _lamp_row(options: dict[str, list[str]]) -> ShoppingScenario:
    return ShoppingScenario.model_validate(
        {"product": LAMP, "options": options, "user": "Mira", "task": "a lamp for me", "gt": None}
    )


@pytest.mark.parametrize(
    ("row", "choice", "old_gold", "new_gold", "kind"),
    [
        ("acceptable_then", "B", "A", "C", "drift"),
        ("acceptable_then", "A", "A", "C", "drift"),  # both rules agree here
        ("old_answer", "A", "A", "B", "acceptable_not_preferred"),
        ("old_nothing", "D", "D", "A", "buy_nothing_but_fit"),
    ],
)
def test_drift_follows_the_harness_rule(
    shop: ShoppingData, row: str, choice: str, old_gold: str, new_gold: str, kind: str
) -> None:
    scenario = _lamp_row(DRIFT_ROWS[row])
    before, now = shop.original["Mira"], shop.evolved["Mira"]
    assert (gold(before, scenario), gold(now, scenario)) == (old_gold, new_gold)
    for style in ("minimal", "detailed"):
        out = rule_feedback(now, scenario, choice, style, drifted=True, original=before)
        assert (out.correct, out.kind) == (False, kind), out
        assert ("preferences have changed" in out.message) == (kind == "drift"), out
        # without the old table the verdict is the same and there is no drift message
        plain = rule_feedback(now, scenario, choice, style)
        assert plain.correct == out.correct and plain.kind != "drift"
    if kind == "drift":
        assert changed_values(before, now, scenario, choice) == ["gooseneck arm"]
        detailed = rule_feedback(now, scenario, choice, "detailed", drifted=True, original=before)
        assert "gooseneck arm" in detailed.message and "clamp mount" in detailed.message


def test_drift_rule_through_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "row.json"
    path.write_text(json.dumps(_lamp_row(DRIFT_ROWS["acceptable_then"]).to_record()))
    args = ["--persona-table", UPDATED, "--scenario", path, "--choice", "B", "--original-table", ORIGINAL]
    out = feedback(*args)
    assert (out["correct"], out["kind"]) == (False, "drift") and "gooseneck arm" in out["message"]
    path.write_text(json.dumps(_lamp_row(DRIFT_ROWS["old_answer"]).to_record()))
    assert feedback(*args[:4], "--choice", "A", *args[6:])["kind"] == "acceptable_not_preferred"


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


# --- embodied personas: the released .py modules, parsed and never run; JSON where there is no .py ----------------


def _embodied_copy(tmp: Path) -> Path:
    out = tmp / "embodied"
    shutil.copytree(EMBODIED, out)
    return out


def test_embodied_personas_from_the_released_py_shape() -> None:
    personas = EMBODIED / "personas"
    assert sorted(p.name for p in personas.iterdir()) == ["evolved_persona.py", "original_persona.py"]
    original = load_personas(personas / "original_persona.py")
    assert set(original) == {"Rowan", "Juno"} and original["Rowan"].startswith("You are Rowan")
    assert "\nbefore it acts" in original["Rowan"]  # the triple-quoted text, line breaks and all
    module = read_literal_module(personas / "evolved_persona.py")
    assert module["prompt_evolved_dict"] == {"Rowan": module["prompt_rowan"], "Juno": module["prompt_juno"]}


def test_embodied_personas_from_json_and_py_first(tmp_path: Path) -> None:
    d = _embodied_copy(tmp_path)
    want = load_embodied_dir(d)
    for stem in ("original_persona", "evolved_persona"):
        prompts = load_personas(d / "personas" / f"{stem}.py")
        (d / "personas" / f"{stem}.json").write_text(json.dumps({k: f"json: {v}" for k, v in prompts.items()}))
    both = load_embodied_dir(d)  # the released .py wins when both are there
    assert both.personas_original == want.personas_original and both.personas_evolved == want.personas_evolved
    for stem in ("original_persona", "evolved_persona"):
        (d / "personas" / f"{stem}.py").unlink()
    only_json = load_embodied_dir(d)
    assert only_json.personas_original == {k: f"json: {v}" for k, v in want.personas_original.items()}
    (d / "personas" / "evolved_persona.json").unlink()
    with pytest.raises(PahfDataError, match=r"evolved_persona\.py: file not found \(nor evolved_persona\.json"):
        load_embodied_dir(d)


@pytest.mark.parametrize(
    ("source", "fragments"),
    [
        ('prompt_dict = {"Rowan": open(MARKER, "w").write("ran")}', ["line 1", "prompt_dict", "not a plain literal"]),
        ('import os\nprompt_dict = {"Rowan": "hi"}', ["line 1", "found Import"]),
        ('prompt_dict = {"Rowan": "hi"}\nopen(MARKER, "w")', ["line 2", "found Expr"]),
        ('def f():\n    return "hi"\nprompt_dict = {"Rowan": f()}', ["line 1", "found FunctionDef"]),
        ('prompt_dict = {"Rowan": f"{MARKER}"}', ["line 1", "not a plain literal"]),
        ('prompt_dict = {"Rowan": prompt_rowan}', ["line 1", "not a plain literal"]),  # never bound
        ('prompt_rowan = "hi"\nprompt_dict = {"Rowan": prompt_rowan.upper()}', ["line 2", "not a plain literal"]),
        ('prompt_dict = {"Rowan": "hi"', ["line 1", "not valid Python"]),
        ('prompt_list = ["hi"]', ["assigns no dict"]),
        ('prompt_dict = {"Rowan": 3}', ["Rowan", "non-empty persona prompt"]),
    ],
)
def test_a_persona_py_that_is_not_plain_literals_is_refused(tmp_path: Path, source: str, fragments: list[str]) -> None:
    marker = tmp_path / "ran.txt"
    d = _embodied_copy(tmp_path)
    bad = d / "personas" / "original_persona.py"
    bad.write_text(source.replace("MARKER", repr(str(marker))) + "\n")
    with pytest.raises(PahfDataError) as caught:
        load_embodied_dir(d)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{bad}:"), message
    for fragment in fragments:
        assert fragment in message, message
    assert not marker.exists()  # refused, not run


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
