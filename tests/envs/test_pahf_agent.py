"""The PAHF agent loop, memory writing and metrics: hand-built cases and the real tiny model (no mocked LLMs)."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support import FIXTURES, pahf_task

from memrl.envs.pahf.agent import ABILITIES, AgentKind, MemoryWriter, PahfAgent, Task, parse_decision, parse_salient
from memrl.envs.pahf.config import PahfSampling
from memrl.envs.pahf.formats import load_shopping_dir
from memrl.envs.pahf.memory import SQLiteMemory
from memrl.envs.pahf.protocol import ShoppingUser, acpe, phase_metrics, shopping_options
from memrl.envs.pahf.records import TaskRecord
from memrl.envs.pahf.shopping import gold
from memrl.envs.pahf.users import named_features, rule_shopping_answer
from memrl.rollout.hf_local import HFBackend

SHOPPING = FIXTURES / "pahf" / "shopping"
SAMPLING = PahfSampling().agent(seed=0)


class BagOfWords:
    """A tiny deterministic embedder: hashed word counts, L2-normalised (fast, and similar texts score high)."""

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)


@pytest.fixture(scope="module")
def tiny(tiny_qwen2: str) -> HFBackend:
    return HFBackend(tiny_qwen2, device="cpu", batch_size=4)


# --- metrics ------------------------------------------------------------------------------------------------------


def _rec(user: str, index: int, correct: bool, used: bool, pass_: int = 0) -> TaskRecord:
    return pahf_task(user=user, index=index, correct=correct, used_feedback=used, **{"pass": pass_})


def test_acpe_is_the_running_mean_of_per_iteration_error_rates() -> None:
    assert acpe([[True, True], [True, False], [False, False]]) == pytest.approx([1.0, 0.75, 0.5])
    records = [
        _rec("u1", 0, False, True),
        _rec("u2", 0, False, True),
        _rec("u1", 1, True, False),
        _rec("u2", 1, False, True),
        _rec("u1", 0, True, False, pass_=1),  # the second pass comes after every first-pass iteration
        _rec("u2", 0, True, False, pass_=1),
    ]
    m = phase_metrics(records)
    assert m["tasks"] == 6 and m["users"] == 2
    assert m["success_rate"] == pytest.approx(3 / 6)
    assert m["feedback_frequency"] == pytest.approx(3 / 6)
    assert m["acpe"] == pytest.approx([1.0, 0.75, 0.5])  # PE = 1, 0.5, 0
    assert m["success_curve"] == pytest.approx([0.0, 0.5, 1.0])
    assert m["feedback_curve"] == pytest.approx([1.0, 0.5, 0.0])


# --- parsing ------------------------------------------------------------------------------------------------------


def test_decision_parsing() -> None:
    def action(raw: str, may_ask: bool = True) -> str | None:
        return parse_decision(raw, "ABCD", may_ask).action

    # The asked-for forms, the JSON large models often write, and what SmolLM2 actually replies.
    assert action("B") == "B" and action("b.") == "B" and action("C) the glass kettle\nit fits") == "C"
    assert action("Option C: the lamp") == "C" and action("A is the correct answer.") == "A"
    assert action("The correct answer is D) buy nothing.") == "D"
    assert action('{"thought": "fits", "action": "b"}') == "B"
    asked = parse_decision("ASK: Which panel do you like?\n", "ABCD", may_ask=True)
    assert (asked.action, asked.question) == ("ask", "Which panel do you like?")
    assert parse_decision('{"action": "ask", "question": "Which?"}', "ABCD", may_ask=True).question == "Which?"
    # An ask the agent may not make, an ask without a question, an unknown letter, an article, an echo: no action.
    assert (
        action("ASK: Which?", may_ask=False) is None
        and action('{"action": "ask", "question": "Which?"}', False) is None
    )
    assert action("ASK: ") is None and action('{"action": "ask", "question": ""}') is None
    assert action('{"action": "E"}') is None and action("E") is None
    assert action("A user who likes tea") is None and action("I would buy A.") is None
    assert action('The user\'s response is: "A"') is None
    decided = parse_decision("B\nit has the glass body", "ABCD", may_ask=False)
    assert decided.thought == "it has the glass body"
    assert parse_salient("Yes.") is True and parse_salient("no") is False
    assert parse_salient('{"salient": "Yes"}') is True
    assert parse_salient('{"salient": false}') is False
    assert parse_salient("maybe") is None


def test_agent_kinds() -> None:
    assert not ABILITIES[AgentKind.NONE].memory and not ABILITIES[AgentKind.NONE].asks
    assert ABILITIES[AgentKind.PRE].asks and not ABILITIES[AgentKind.PRE].learns_from_feedback
    assert not ABILITIES[AgentKind.POST].asks and ABILITIES[AgentKind.POST].learns_from_feedback
    pahf = ABILITIES[AgentKind.PAHF]
    assert pahf.asks and pahf.learns_from_answers and pahf.learns_from_feedback


# --- users --------------------------------------------------------------------------------------------------------


def test_rule_answer_reveals_only_the_features_asked_about() -> None:
    data = load_shopping_dir(SHOPPING)
    scenario = data.phases[1][0]
    table = data.original[scenario.user]
    prefs = table.products[scenario.product]
    feature = next(iter(prefs))
    answer = rule_shopping_answer(table, scenario, f"Which {feature} do you like?")
    assert named_features(table, scenario.product, f"Which {feature} do you like?") == [feature]
    assert prefs[feature].like_most in answer
    others = [p.like_most for f, p in prefs.items() if f != feature]
    assert not any(o in answer for o in others)
    vague = rule_shopping_answer(table, scenario, "What do you want?")
    assert "ask about one feature" in vague and prefs[feature].like_most not in vague


def test_persona_llm_user_answers_and_corrects_in_character(tiny: HFBackend) -> None:
    """--user-sim llm: the persona model answers questions (both domains) and corrects embodied actions."""
    from memrl.envs.pahf import prompts
    from memrl.envs.pahf.embodied import embodied_task
    from memrl.envs.pahf.formats import load_embodied_dir
    from memrl.envs.pahf.protocol import EmbodiedUser
    from memrl.envs.pahf.users import PersonaLLM, embodied_wanted
    from memrl.rollout.base import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=12)
    persona = PersonaLLM(tiny, params)

    def reply(messages: list[dict[str, str]]) -> str:
        return asyncio.run(tiny.achat(messages, params)).text.strip()  # type: ignore[arg-type]

    shop = load_shopping_dir(SHOPPING)
    scenario = shop.phases[1][0]
    table, text = shop.original[scenario.user], shop.personas_original[scenario.user]
    user = ShoppingUser(scenario, table, None, text, "minimal", persona)
    answer = asyncio.run(user.answer("Which bulb do you like?"))
    assert answer == reply(prompts.persona_answer_messages(text, scenario.task, "Which bulb do you like?"))
    wrong = next(x for x in "ABCD" if x != gold(table, scenario))
    assert asyncio.run(user.feedback(wrong))  # shopping corrections stay rule-based: never the LLM's whim

    embodied = load_embodied_dir(SHOPPING.parent / "embodied")
    etask = embodied_task(embodied.original[0], seed=0)
    mistaken = next(o for o in etask.options if o.label != etask.gold)
    person = embodied.personas_original[etask.scenario.user]
    euser = EmbodiedUser(etask, person, "minimal", persona)
    expected = prompts.persona_feedback_messages(
        person, etask.scenario.task, mistaken.text, embodied_wanted(etask.scenario)
    )
    assert asyncio.run(euser.feedback(mistaken.label)) == reply(expected)
    assert person in expected[0]["content"] and "green tea" in expected[0]["content"]


# --- memory writing and the loop with the real tiny model ---------------------------------------------------------


def test_integrate_merges_above_tau_and_adds_below(tiny: HFBackend) -> None:
    writer = MemoryWriter(tiny, SAMPLING, tau=0.8)
    failures: Counter[str] = Counter()
    with SQLiteMemory(None, BagOfWords()) as store:
        first = store.add("Mira", "Mira likes an LED panel desk lamp with a gooseneck arm")
        store.add("Tomas", "Mira likes an LED panel desk lamp with a gooseneck arm")  # another user's twin
        added = asyncio.run(writer.integrate(store, "Mira", "Mira prefers glass kettles over plastic", failures))
        assert added.action == "add" and added.note_id != first
        merged = asyncio.run(
            writer.integrate(store, "Mira", "Mira likes an LED panel desk lamp with a clamp mount arm", failures)
        )
        assert merged.action == "merge" and merged.note_id == first and merged.similarity >= 0.8  # type: ignore[operator]
        notes = store.list("Mira")
        assert [n.id for n in notes] == [first, added.note_id]
        assert notes[0].text == merged.note  # replaced in place: the model's merge, or the new note when unusable
        assert len(store.list("Tomas")) == 1  # per-user isolation
    assert failures["merge"] in (0, 1)


def test_tiny_model_garbage_is_counted_not_fatal(tiny: HFBackend) -> None:
    """tiny-qwen2 writes no usable JSON: the decision fails (counted, the task is wrong) and the run goes on."""
    data = load_shopping_dir(SHOPPING)
    scenario = data.phases[1][0]
    table = data.original[scenario.user]
    task = Task("shopping", scenario.user, scenario.task, shopping_options(scenario), gold(table, scenario))
    user = ShoppingUser(scenario, table, None, data.personas_original[scenario.user], "minimal", None)
    agent = PahfAgent(AgentKind.PAHF, tiny, MemoryWriter(tiny, SAMPLING), SAMPLING, top_k=3)
    with SQLiteMemory(None, BagOfWords()) as store:
        store.add(scenario.user, f"{scenario.user} likes LED panel desk lamps")
        outcome = asyncio.run(agent.run(task, user, store, learning=True))
        failures: Counter[str] = Counter()
        write = asyncio.run(agent.writer.write(store, task, "feedback", "I don't like halogen bulbs.", failures))
        # An unusable salience reply is counted and the correction stored anyway (the feedback itself, when the
        # note is unusable too).
        assert failures["salience"] == 1 and write.action in ("add", "merge")
        assert any("halogen" in n.text for n in store.list(scenario.user))
    assert outcome.choice is None and outcome.correct is False
    assert outcome.failures["decision"] == 1
    assert outcome.retrieved and outcome.retrieved[0]["text"].endswith("LED panel desk lamps")
    assert task.options["D"] == "buy nothing"


# --- resumption ---------------------------------------------------------------------------------------------------


def test_resumed_worker_restores_the_recorded_memory(tiny_qwen2: str, tmp_path: Path) -> None:
    """A crash after a memory write but before its record: the rerun's first task rebuilds the store."""
    from memrl.envs.pahf.config import PahfEvalConfig
    from memrl.envs.pahf.runner import Roles, UserRunner, WorkerSpec, memory_path
    from memrl.rollout.config import HFModelConfig

    model = HFModelConfig(backend="hf", model=tiny_qwen2)
    cfg = PahfEvalConfig(domain="shopping", data=SHOPPING, model=model)
    runner = UserRunner(WorkerSpec(cfg, Roles(model, None), tmp_path))
    runner._embedder = BagOfWords()  # MiniLM is not needed to test the bookkeeping
    with SQLiteMemory(memory_path(tmp_path, "sqlite", "Mira"), BagOfWords()) as store:
        for text in ("likes LED panels", "dislikes halogen", "a note whose record was never written"):
            store.add("Mira", text)
    kept = runner.store("Mira", ["likes LED panels", "dislikes halogen"])
    assert kept is not None and [n.text for n in kept.list("Mira")] == ["likes LED panels", "dislikes halogen"]
    assert runner.store("Mira", None) is kept  # later tasks of the run reuse the open store
    with SQLiteMemory(memory_path(tmp_path, "sqlite", "Mira"), BagOfWords()) as reopened:
        assert len(reopened.list("Mira")) == 2  # and the file on disk agrees
