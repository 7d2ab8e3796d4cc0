"""The memory judger: input formatting, the three heads, learning, resume, the scorer, and `memrl eval judger`.

The pairs are generated here in the judger-data contract: a query restates its task's restaurant, and a stored pair
is relevant iff it comes from that task and answers a slot the dialogue still misses.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from memrl.data_gen.judger_pairs import read_pairs
from memrl.envs.tod.ranking import auc
from memrl.rollout.judger import JudgerInput, load_judger
from memrl.train.config import JudgerStage, LoraConfig
from memrl.train.hf_trainer import TrainContext
from memrl.train.judger.trainer import ALPHA_GRID

RESTAURANTS = ["Sakura Garden", "Blue Fin", "La Piazza", "Golden Wok", "The Oak Room", "Casa Verde", "Red Lantern",
               "Harbor Grill", "Little Saigon", "Olive Tree", "Spice Route", "Maple House", "Copper Pot"]  # fmt: skip
CITIES = ["San Jose", "Oakland", "Berkeley", "Fremont", "Palo Alto", "Sunnyvale"]
DATES = ["March 3rd", "next Friday", "the 12th", "Sunday", "April 9th", "tomorrow"]
TIMES = ["6 pm", "7:30 pm", "noon", "8 pm", "5:45 pm"]
PLACES = ["the airport", "Union Station", "the stadium", "Main Street"]
QUESTIONS = {
    "restaurant_name": "Which restaurant is it?",
    "city": "Which city is the restaurant in?",
    "date": "What date is the reservation for?",
    "time": "What time is the reservation?",
    "party_size": "How many people are coming?",
    "destination": "Where is the ride going?",
    "number_of_seats": "How many seats are needed?",
}
GOAL_SLOTS = ("date", "time", "party_size")


def query_rows(persona: int, rng: random.Random) -> list[dict[str, Any]]:
    """One confirming session and every QA pair of three earlier sessions (its task, same intent, a ride)."""
    own, other = rng.sample(RESTAURANTS, 2)
    city, other_city = rng.sample(CITIES, 2)
    goal = {"restaurant_name": own, "city": city, "date": rng.choice(DATES), "time": rng.choice(TIMES),
            "party_size": str(rng.randint(2, 8))}  # fmt: skip
    stated = rng.sample(GOAL_SLOTS, rng.randint(0, 1))
    missing = [s for s in GOAL_SLOTS if s not in stated]
    context = [
        {"speaker": "user", "utterance": f"Hi again, I want to wrap up my table at {own} in {city}."},
        {"speaker": "assistant", "utterance": "Happy to help with that booking."},
        *({"speaker": "user", "utterance": f"The {s.replace('_', ' ')} is {goal[s]}."} for s in stated),
    ]
    other_goal = {"restaurant_name": other, "city": other_city, "date": rng.choice(DATES),
                  "time": rng.choice(TIMES), "party_size": str(rng.randint(2, 8))}  # fmt: skip
    units = [
        (1, f"reserve a table at {own} in {city}", goal, None),
        (2, f"reserve a table at {other} in {other_city}", other_goal, "same_intent"),
        (3, f"book a ride to {rng.choice(PLACES)}", {"destination": rng.choice(PLACES), "number_of_seats": "2"},
         "other_intent"),
    ]  # fmt: skip
    rows = []
    for unit, intent, qa, kind in units:
        for slot, answer in qa.items():
            label = int(kind is None and slot in missing)
            rows.append({
                "key": f"{persona}/9/{unit}/{slot}", "query_id": f"{persona}/9", "persona_id": persona,
                "session_id": 9, "service": "Restaurants_1", "intent": "ReserveRestaurant", "context": context,
                "intent_query": f"reserve a table at a restaurant; restaurant name {own}; city {city}",
                "missing_slots": missing, "missing_descriptions": [QUESTIONS[s] for s in missing],
                "memory_session_id": unit, "memory_intent": intent, "memory_service": "Restaurants_1",
                "slot": slot, "question": QUESTIONS[slot], "answer": answer, "label": label,
                "negative": None if label else (kind or "filled"),
            })  # fmt: skip
    return rows


def write_pairs(folder: Path, train: int, evaluation: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    for split, n, first in (("train", train, 0), ("eval", evaluation, 1000)):
        (folder / split).mkdir(parents=True, exist_ok=True)
        rows = [row for persona in range(first, first + n) for row in query_rows(persona, rng)]
        (folder / split / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def train(stage: JudgerStage, base: str, data: Path, out: Path) -> Path:
    from memrl.train.judger.trainer import train_judger

    return train_judger(stage, base, data, TrainContext(out, "judger", 0, "none", "test-judger"))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pairs(tmp_path_factory.mktemp("judger-data"), train=24, evaluation=8)


@pytest.fixture(scope="module")
def minilm_judger(pairs: Path, tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Path:
    stage = JudgerStage(kind="judger", model="judger", lr=2e-4, max_steps=12, batch_size=16, micro_batch_size=16,
                        max_length=128, checkpoints={"save_steps": 100})  # fmt: skip
    return train(stage, "minilm", pairs, tmp_path_factory.mktemp("minilm-judger"))


# ---- formatting -----------------------------------------------------------------------------------------------


def long_item(turns: int) -> JudgerInput:
    context = [
        {"speaker": "user" if i % 2 == 0 else "assistant", "utterance": f"turn {i} says something quite long here"}
        for i in range(turns)
    ]
    return JudgerInput(context, ["date", "time"], "What date is the reservation for?", "March 3rd", "reserve a table",
                       "date")  # fmt: skip


def test_cross_encoder_pair_keeps_the_newest_turns(model_cache: Path) -> None:
    from transformers import AutoTokenizer

    from memrl.core import models
    from memrl.rollout.judger.heads import build_head
    from memrl.rollout.judger.inputs import cross_encoder_pair

    tokenizer = AutoTokenizer.from_pretrained(models.resolve("minilm"))
    first, note = cross_encoder_pair(long_item(40), tokenizer, 96)
    assert "turn 39" in first and "turn 0 " not in first and first.endswith("Missing: date, time")
    expected = "Note (earlier session: reserve a table). Slot: date. Question: What date is the reservation for?"
    assert note == expected + " Answer: March 3rd"
    batch = build_head("cross_encoder", tokenizer, 96).encode([long_item(40), long_item(2)])
    assert batch["input_ids"].shape[0] == 2 and batch["input_ids"].shape[1] <= 96
    short, _ = cross_encoder_pair(long_item(2), tokenizer, 96)
    assert short.startswith("user: turn 0")


def test_the_current_task_reaches_the_judger_and_is_never_cut(model_cache: Path) -> None:
    """A confirming session may open with "Thank you!": the task (retrieval's intent query) tells the bookings apart."""
    from dataclasses import replace

    from transformers import AutoTokenizer

    from memrl.core import models
    from memrl.rollout.judger.inputs import cross_encoder_pair, prompt_parts

    task = "reserve a table at a restaurant; restaurant name Blue Fin"
    item = JudgerInput(long_item(40).context, ["date", "time"], "Q?", "A", task=task)
    assert item.task == task
    tokenizer = AutoTokenizer.from_pretrained(models.resolve("minilm"))
    first, _ = cross_encoder_pair(item, tokenizer, 96)
    assert first.endswith(f"Task: {task}\nMissing: date, time") and "turn 39" in first and "turn 0 " not in first
    assert prompt_parts(item, [])[1] == f"Task: {task}\nDetails still missing: date, time"
    assert prompt_parts(replace(item, task=""), [])[1] == "Details still missing: date, time"


def test_causal_prompt_keeps_the_instruction_and_newest_turns(tiny_qwen2: str) -> None:
    from transformers import AutoTokenizer

    from memrl.rollout.judger.inputs import INSTRUCTION, QUESTION, causal_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    prompt = causal_prompt(long_item(60), tokenizer, 600)
    assert INSTRUCTION in prompt and QUESTION in prompt and "turn 59" in prompt and "turn 0 " not in prompt
    assert prompt.endswith("<|im_start|>assistant\n")  # the chat template's generation prompt: the answer is next
    assert len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= 600


@pytest.mark.parametrize("head_name", ["cross_encoder", "seq_cls"])
def test_tokenize_keeps_every_turn_that_fits_and_cuts_the_rest_like_one_at_a_time(
    head_name: str, tiny_qwen2: str
) -> None:
    from transformers import AutoTokenizer

    from memrl.core import models
    from memrl.rollout.judger.heads import build_head
    from memrl.rollout.judger.inputs import causal_prompt, cross_encoder_pair, whole_pair, whole_prompt

    path = models.resolve("minilm") if head_name == "cross_encoder" else tiny_qwen2
    head = build_head(head_name, AutoTokenizer.from_pretrained(path), 300)
    items = [long_item(2), long_item(60), long_item(3), long_item(60)]
    rows = head.tokenize(items)["input_ids"]
    assert all(len(row) <= 300 for row in rows)
    for item, row in zip(items, rows, strict=True):
        if head_name == "cross_encoder":
            whole = head.tokenizer(*whole_pair(item))["input_ids"]
            cut = head.tokenizer(*cross_encoder_pair(item, head.tokenizer, 300))["input_ids"]
        else:
            whole = head.tokenizer(whole_prompt(item, head.tokenizer), add_special_tokens=False)["input_ids"]
            cut = head.tokenizer(causal_prompt(item, head.tokenizer, 300), add_special_tokens=False)["input_ids"]
        assert row == (whole if len(whole) <= 300 else cut)  # every turn where it fits, else the per-item cut
    newest = head.tokenizer.decode(rows[1])
    assert "turn 59" in newest and "turn 0 " not in newest  # the long dialogue lost its oldest turns


class WrapperOnly:
    """A tokenizer seen without its Rust backend: `tokenize_texts` must then go through the transformers call."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        if name == "backend_tokenizer":
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer(*args, **kwargs)


def test_tokenize_texts_gives_the_transformers_ids(tiny_qwen2: str) -> None:
    from transformers import AutoTokenizer

    from memrl.core import models
    from memrl.rollout.judger.heads import tokenize_texts

    pairs = [("user: hi\nMissing: date", "Note. Question: When? Answer: Sunday"), ("a " * 80, "b c")]
    bert = AutoTokenizer.from_pretrained(models.resolve("minilm"))
    bert.truncation_side = "left"
    direct = tokenize_texts(bert, pairs, 40, "only_first", special_tokens=True)
    assert direct == tokenize_texts(WrapperOnly(bert), pairs, 40, "only_first", special_tokens=True)
    assert set(direct) == {"input_ids", "token_type_ids"} and len(direct["input_ids"][1]) == 40
    qwen = AutoTokenizer.from_pretrained(tiny_qwen2)
    texts = ["the user prefers short answers", "json " * 90]
    direct = tokenize_texts(qwen, texts, 50, "longest_first", special_tokens=False)
    assert direct == tokenize_texts(WrapperOnly(qwen), texts, 50, "longest_first", special_tokens=False)
    assert list(direct) == ["input_ids"] and len(direct["input_ids"][1]) == 50

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(4)  # 40 long texts go out in four slices of 10 on four threads and come back in order
    try:
        many = [f"the user prefers {i} short answers " * (i % 7 + 1) * 60 for i in range(40)]
        assert tokenize_texts(qwen, many, 50, "longest_first", special_tokens=False) == tokenize_texts(
            WrapperOnly(qwen), many, 50, "longest_first", special_tokens=False
        )
    finally:
        torch.set_num_threads(threads)


def spliced_items() -> list[JudgerInput]:
    """Items for the splicer: no dialogue, unicode, overflow, a turn too long alone, white space at a part's edge
    (the splicer refuses those), and a TOD query's candidates sharing one dialogue."""
    tod = [{"speaker": "user", "utterance": "Book La Piazza in San Jose, 7:30 pm."}]
    return [
        JudgerInput([], [], "Which city?", "Oakland"),
        JudgerInput([{"speaker": "user", "utterance": "Café für 2 — 東京で 🍣?\nnaïve ½"}], ["city"], "¿Dónde?", "Köln",
                    "", "city"),
        long_item(2),
        long_item(60),  # over max_length: the newest turns that fit
        JudgerInput([{"speaker": "user", "utterance": "word " * 400 + "end"}], ["date"], "When?", "Sunday"),  # too long
        JudgerInput([{"speaker": "user", "utterance": "  trailing space  "}], ["date"], "When?", "Sunday"),
        JudgerInput([{"speaker": "user", "utterance": "hi"}], ["date"], "When?", "Sunday\n"),
        *(JudgerInput(tod, ["date", "time"], QUESTIONS[slot], answer, "reserve a table at La Piazza", slot)
          for slot, answer in (("date", "Sunday"), ("time", "8 pm"), ("party_size", "4"))),
    ]  # fmt: skip


def whole_text_rows(head: Any, items: list[JudgerInput]) -> list[list[int]]:
    """Each item's ids from its whole prompt through the transformers call: every turn where the prompt fits,
    else the newest turns that fit, cut by the tokenizer where the newest alone is too long."""
    from memrl.rollout.judger.inputs import causal_prompt, whole_prompt

    tokenizer, limit = head.tokenizer, head.max_length
    rows = []
    for item in items:
        row = tokenizer(whole_prompt(item, tokenizer), add_special_tokens=head.special_tokens)["input_ids"]
        if len(row) > limit:
            cut = causal_prompt(item, tokenizer, limit)
            row = tokenizer(cut, add_special_tokens=head.special_tokens, truncation=True, max_length=limit)["input_ids"]
        rows.append(row)
    return rows


@pytest.mark.parametrize(
    ("base", "head_name", "template", "limit", "shift"),
    [("tiny-qwen2", "seq_cls", True, 600, 0), ("tiny-llama", "yes_no", True, 600, 0),
     ("tiny-qwen2", "seq_cls", False, 600, 0), ("tiny-llama", "seq_cls", False, 600, 0),
     ("smollm2", "yes_no", True, 200, 1)],  # GPT-2's split, with a token for "\n\n": one break starts each piece
)  # fmt: skip
def test_spliced_prompts_have_the_whole_prompts_ids(
    base: str, head_name: str, template: bool, limit: int, shift: int, request: pytest.FixtureRequest
) -> None:
    from tokenizers import processors
    from transformers import AutoTokenizer

    from memrl.rollout.judger.heads import build_head
    from memrl.rollout.judger.inputs import all_turns, prompt_parts, whole_prompt

    tokenizer = AutoTokenizer.from_pretrained(request.getfixturevalue(base.replace("-", "_")))
    if not template:  # "...\nAnswer:" prompts, and a tokenizer that adds a BOS of its own
        tokenizer.chat_template = None
        bos = tokenizer.convert_tokens_to_ids("<|im_start|>")
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)]
        )
    head = build_head(head_name, tokenizer, limit)
    items = spliced_items()
    assert head.splicer is not None and head.splicer.special == (0 if template else 1)
    assert head.splicer.cuts[1:] == (
        2 - shift,
        2 - shift,
        2 - shift,
    )  # "\n\n" between the parts and before the question
    refused = [head.splicer.pieces(prompt_parts(item, all_turns(item))) is None for item in items]
    assert refused == [False] * 5 + [True, True] + [False] * 3
    rows = head.tokenize(items)["input_ids"]
    assert rows == whole_text_rows(head, items)
    whole = [len(tokenizer(whole_prompt(item, tokenizer))["input_ids"]) for item in items]
    assert [n > limit for n in whole] == [False] * 3 + [True, True] + [False] * 5 and len(rows[4]) == limit
    assert rows[0][: head.splicer.special] == ([] if template else [bos])


def test_a_tokenizer_that_fails_the_probes_is_not_spliced(tiny_llama: str) -> None:
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    from memrl.rollout.judger.heads import build_head

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    # A space before every piece: the pieces' ids are not the whole prompt's.
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    head = build_head("seq_cls", tokenizer, 600)
    items = spliced_items()
    assert head.splicer is None
    assert head.tokenize(items)["input_ids"] == whole_text_rows(head, items)


def test_pad_fills_rows_on_either_side() -> None:
    from memrl.rollout.judger.heads import pad

    ids, mask = pad([[1, 2, 3], [4]], 0, left=True)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad([[1, 2, 3], [4]], 9, left=False)
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_scorer_batches_by_token_count_and_keeps_the_input_order(model_cache: Path) -> None:
    from transformers import AutoTokenizer

    from memrl.core import models
    from memrl.rollout.judger.heads import build_head
    from memrl.rollout.judger.scorer import PAD_SLACK, JudgerScorer

    path = models.resolve("minilm")
    head = build_head("cross_encoder", AutoTokenizer.from_pretrained(path), 128)
    scorer = JudgerScorer(head.load_model(path), head)
    items = [long_item(n) for n in (9, 1, 30, 4, 2)]
    assert scorer.score([]) == []
    batched = scorer.score(items, batch_size=2)
    assert batched == pytest.approx([scorer.score([item])[0] for item in items], abs=1e-5)
    chunks = [chunk for chunk, _ in scorer.batches(items * 3, batch_size=4)]
    assert sorted(i for chunk in chunks for i in chunk) == list(range(15)) and max(map(len, chunks)) == 4
    lengths = [len(ids) for ids in head.tokenize(items * 3)["input_ids"]]
    assert all(max(lengths[i] for i in c) <= PAD_SLACK * min(lengths[i] for i in c) for c in chunks)


# ---- heads ----------------------------------------------------------------------------------------------------


def assert_scores(folder: Path, pairs: Path) -> list[float]:
    rows = read_pairs(pairs / "eval" / "pairs.jsonl")[:5]
    items = [r.judger_input() for r in rows]
    scorer = load_judger(folder)
    batched = scorer.score(items, batch_size=4)
    alone = [scorer.score([item])[0] for item in items]
    assert all(0.0 < p < 1.0 for p in batched)
    assert batched == pytest.approx(alone, abs=1e-5)  # padding changes nothing
    return batched


@pytest.mark.slow
@pytest.mark.parametrize(("base", "head"), [("tiny-qwen2", "seq_cls"), ("tiny-llama", "yes_no")])
def test_causal_heads_train_with_lora_and_score(base: str, head: str, pairs: Path, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:  # fmt: skip
    request.getfixturevalue(base.replace("-", "_"))  # pulled once per session
    stage = JudgerStage(kind="judger", model="judger", head=head, lora=LoraConfig(rank=4, alpha=8), lr=1e-3,
                        max_steps=2, batch_size=4, micro_batch_size=2, max_length=400,
                        checkpoints={"save_steps": 1})  # fmt: skip
    final = train(stage, base, pairs, tmp_path / "stage")
    info = json.loads((final / "memrl_judger.json").read_text())
    alpha, rule = info.pop("alpha"), info.pop("alpha_rule", None)
    assert alpha in {None, *ALPHA_GRID}  # chosen on the training individuals kept out of training
    assert (rule is None) == (alpha is None) and (rule is None or "noise of the best" in rule)  # and says how
    assert info == {"head": head, "base": base, "max_length": 400, "adapter": False}  # LoRA merged into the model
    assert not (final / "adapter_config.json").exists()
    assert json.loads((final / "memrl_checkpoint.json").read_text())["steps"] == 2
    assert_scores(tmp_path / "stage", pairs)  # a stage folder loads its final/

    if head == "seq_cls":  # resume: the interrupted run continues from its last checkpoint
        shutil.rmtree(final)
        state_file = tmp_path / "stage" / "checkpoint-2" / "trainer_state.json"
        state = json.loads(state_file.read_text())
        state["log_history"].append({"resumed_from": "checkpoint-2", "step": 2})
        state_file.write_text(json.dumps(state))
        final = train(stage.model_copy(update={"max_steps": 3}), base, pairs, tmp_path / "stage")
        history = json.loads((tmp_path / "stage" / "log_history.json").read_text())
        assert {"resumed_from": "checkpoint-2", "step": 2} in history
        assert [row["step"] for row in history if "loss" in row] == [1, 2, 3]
        assert json.loads((final / "memrl_checkpoint.json").read_text())["steps"] == 3


@pytest.mark.slow
def test_cross_encoder_learns(minilm_judger: Path, pairs: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    from memrl.core import models
    from memrl.rollout.judger.heads import build_head
    from memrl.rollout.judger.scorer import JudgerScorer

    rows = read_pairs(pairs / "eval" / "pairs.jsonl")
    items, labels = [r.judger_input() for r in rows], [r.label for r in rows]
    trained = auc(labels, load_judger(minilm_judger).score(items))
    torch.manual_seed(0)
    head = build_head("cross_encoder", AutoTokenizer.from_pretrained(models.resolve("minilm")), 128)
    untrained = auc(labels, JudgerScorer(head.load_model(models.resolve("minilm")), head).score(items))
    assert trained >= 0.8 and trained >= untrained + 0.15, (trained, untrained)
    info = json.loads((minilm_judger / "memrl_judger.json").read_text())
    assert info["head"] == "cross_encoder" and not info["adapter"]
    assert_scores(minilm_judger, pairs)


# ---- evaluation -----------------------------------------------------------------------------------------------

RECALLS = {f"{measure}@{k}" for measure in ("recall", "pair_recall") for k in (1, 3, 5)}
KEYS = {*RECALLS, *(f"{ranking}_{name}" for ranking in ("retrieval", "judger", "ceiling") for name in RECALLS),
        "auc", "alpha_sweep", "queries", "pairs", "positives"}  # fmt: skip


@pytest.mark.slow
def test_eval_judger_cli_writes_every_metric_and_resumes(minilm_judger: Path, pairs: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from memrl.app.cli.main import app
    from memrl.train.judger.evaluate import evaluate_judger

    out = tmp_path / "report"
    result = CliRunner().invoke(
        app,
        ["eval", "judger", "--model", str(minilm_judger.parent), "--data", str(pairs / "eval"), "--out", str(out),
         "--retriever", "bm25", "--top-units", "2"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output[-2000:]
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    metrics = json.loads((out / "metrics.json").read_text())
    assert printed == metrics and set(metrics) >= KEYS
    assert (metrics["queries"], metrics["pairs"], metrics["top_units"]) == (8, 8 * 12, 2)
    assert list(metrics["alpha_sweep"]) == ["0.0", "0.25", "0.5", "0.75", "1.0"]
    assert set(metrics["alpha_sweep"]["0.5"]) == RECALLS
    assert metrics["alpha_sweep"]["1.0"]["recall@5"] == metrics["retrieval_recall@5"]
    assert metrics["alpha_sweep"]["0.0"]["recall@1"] == metrics["judger_recall@1"]
    assert metrics["alpha_sweep"]["0.0"]["pair_recall@3"] == metrics["judger_pair_recall@3"]
    per_query = metrics["alpha_sweep_recall@5_per_query"]  # the sweep's means, query by query
    assert list(per_query) == list(metrics["alpha_sweep"]) and len(metrics["query_ids"]) == 8
    for a, values in per_query.items():
        assert len(values) == 8 and None not in values  # every query of these pairs has gold
        assert sum(values) / len(values) == pytest.approx(metrics["alpha_sweep"][a]["recall@5"], abs=1e-4)
    effect = metrics["recall@5_per_query"]  # fused at the alpha used, retrieval alone, the judger alone
    for name, key in (("fused", "recall@5"), ("retrieval", "retrieval_recall@5"), ("judger", "judger_recall@5")):
        assert sum(effect[name]) / 8 == pytest.approx(metrics[key], abs=1e-4), name
    for k in (1, 3, 5):  # no ranking beats the ceiling
        for ranking in ("", "retrieval_", "judger_"):
            assert metrics[f"{ranking}recall@{k}"] <= metrics[f"ceiling_recall@{k}"]
            assert metrics[f"{ranking}pair_recall@{k}"] <= metrics[f"ceiling_pair_recall@{k}"]
    assert all(0.0 <= metrics[k] <= 1.0 for k in KEYS - {"alpha_sweep", "queries", "pairs", "positives"})

    # A killed run resumes: keep half of the scores, rerun, and every pair is scored exactly once.
    lines = (out / "scores.jsonl").read_text().splitlines()
    assert len(lines) == metrics["pairs"]
    (out / "scores.jsonl").write_text("\n".join(lines[:50]) + "\n" + lines[50][:20])  # a torn last line too
    again = evaluate_judger(str(minilm_judger), pairs / "eval" / "pairs.jsonl", out, retriever="bm25", top_units=2)
    keys = [json.loads(line)["key"] for line in (out / "scores.jsonl").read_text().splitlines()]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == metrics["pairs"]
    assert again["auc"] == pytest.approx(metrics["auc"], abs=1e-3)


def test_eval_without_a_judger_is_retrieval_only(pairs: Path, tmp_path: Path) -> None:
    from memrl.train.judger.evaluate import evaluate_judger

    metrics = evaluate_judger(None, pairs / "eval" / "pairs.jsonl", tmp_path, retriever="bm25", top_units=None)
    assert metrics["recall@5"] == metrics["retrieval_recall@5"]
    assert metrics["pair_recall@5"] == metrics["retrieval_pair_recall@5"]
    assert metrics["auc"] is None and metrics["judger_recall@1"] is None and metrics["alpha_sweep"] is None
    assert metrics["alpha_sweep_recall@5_per_query"] is None and metrics["recall@5_per_query"] is None
    assert metrics["judger_pair_recall@1"] is None and 0.0 < metrics["ceiling_recall@1"] <= 1.0
    assert not (tmp_path / "scores.jsonl").exists()


def test_malformed_pairs_fail_in_one_line(tmp_path: Path) -> None:
    from memrl.core.errors import ConfigError
    from memrl.train.judger.data import require_pairs

    bad = tmp_path / "eval" / "pairs.jsonl"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"key": "1", "query_id": "q"}) + "\n")
    with pytest.raises(ConfigError, match=r"pairs.jsonl:1: judger pair lacks persona_id"):
        read_pairs(require_pairs(tmp_path, "eval"))
    with pytest.raises(ConfigError, match=r"train/pairs.jsonl does not exist: build judger data with `memrl data"):
        require_pairs(tmp_path, "train")
