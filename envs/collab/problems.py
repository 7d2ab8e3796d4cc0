"""Problems for MultiSessionCollab: the task table, record parsers, loading, sampling and train/eval splits.

Each task reads both the original benchmark's cache files (`{problem, solution}` records) and the columns of the
hub dataset the benchmark sampled from, and turns them into one `Problem` shape the environment and graders share.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from memrl.core.errors import ConfigError, closest
from memrl.core.files import check_file, parse_json, read_jsonl, read_text
from memrl.core.schema import as_text
from memrl.core.schema import check_disjoint as check_splits_disjoint


class AnswerKind(StrEnum):
    MATH = "math"  # a final expression, compared symbolically
    CHOICE = "choice"  # one of `Problem.choices`
    FREE = "free"  # anything else: needs the LLM judge


def normalize_text(text: str) -> str:
    """Lower-case with whitespace collapsed: the key two problems are 'the same question' under."""
    return " ".join(text.lower().split())


def problem_id(task: str, question: str) -> str:
    digest = hashlib.sha256(normalize_text(question).encode()).hexdigest()[:12]
    return f"{task}-{digest}"


_NUMBERED_OPTIONS = re.compile(r"(?m)^\s*0[.)]\s")


@dataclass(frozen=True)
class Problem:
    id: str
    task: str
    question: str
    answer: str  # math: the boxed expression; choice: the gold option's text
    kind: AnswerKind
    choices: tuple[str, ...] = ()
    solution: str = ""

    def __post_init__(self) -> None:
        if self.kind is AnswerKind.CHOICE and self.answer not in self.choices:
            raise ValueError(f"answer {self.answer[:60]!r} is not one of the {len(self.choices)} options")

    @property
    def labels(self) -> tuple[str, ...]:
        """The option labels as the question prints them: '0', '1', ... (MMLU style) or 'A', 'B', ..."""
        options_block = self.question.rpartition("Choices:")[2]  # the stem may hold numbered lists of its own
        if _NUMBERED_OPTIONS.search(options_block):
            return tuple(str(i) for i in range(len(self.choices)))
        return tuple(chr(ord("A") + i) for i in range(len(self.choices)))

    @property
    def answer_index(self) -> int:
        """Index of the gold option in `choices` (-1 for problems that have none)."""
        return self.choices.index(self.answer) if self.answer in self.choices else -1

    def to_record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task": self.task,
            "question": self.question,
            "answer": self.answer,
            "kind": str(self.kind),
            "choices": list(self.choices),
            "solution": self.solution,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Problem:
        task, question = as_text(record["task"], "task"), as_text(record["question"], "question")
        return cls(
            id=as_text(record.get("id") or problem_id(task, question), "id"),
            task=task,
            question=question,
            answer=as_text(record["answer"], "answer"),
            kind=AnswerKind(record["kind"]),
            choices=tuple(as_text(c, "choices") for c in record.get("choices") or ()),
            solution=as_text(record.get("solution") or "", "solution"),
        )


@dataclass(frozen=True)
class Fields:
    """What a record parser extracts; `TaskSpec.parse` adds the id, task and kind."""

    question: str
    answer: str
    choices: tuple[str, ...] = ()
    solution: str = ""


# ---------------------------------------------------------------- record parsers
# Each takes one record, in the original cache format or with the hub dataset's columns, and raises
# KeyError/ValueError/TypeError on a malformed one (the loader reports which file and record).


_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _boxed_spans(text: str) -> list[tuple[int, str]]:
    """(position, content) of every \\boxed{...} / \\fbox{...} in `text`, braces matched."""
    spans = []
    for match in _BOXED.finditer(text):
        rest = text[match.end() :]
        if not rest.lstrip().startswith("{"):  # the brace-less "\\boxed 5" form
            token = rest.split(None, 1)[0].rstrip("$.,") if rest.strip() else ""
            if token:
                spans.append((match.start(), token))
            continue
        rest = rest.lstrip()
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                spans.append((match.start(), rest[1:i].strip()))
                break
    return spans


def last_boxed(text: str) -> str | None:
    """The final answer a MATH solution boxes: the last box, or all boxes of the last paragraph joined by ', '.

    A few solutions box each of several answers ('$\\boxed{\\frac{\\pi}{4}}$ and $\\boxed{\\frac{5\\pi}{4}}$');
    keeping only the last would drop the others.
    """
    spans = _boxed_spans(text)
    if not spans:
        return None
    paragraph_start = text.rfind("\n\n", 0, spans[-1][0])
    last_paragraph = [content for pos, content in spans if pos > paragraph_start]
    return ", ".join(last_paragraph)


def _parse_math(record: Mapping[str, Any]) -> Fields:
    solution = as_text(record["solution"], "solution")
    answer = record.get("answer") or last_boxed(solution)  # MATH-500 on the hub has an answer column
    if not answer:
        raise ValueError("solution has no \\boxed{...} final answer")
    return Fields(question=as_text(record["problem"], "problem"), answer=str(answer).strip(), solution=solution)


def _options_after(text: str, header: str, labels: Callable[[int], str]) -> tuple[str, ...]:
    """Options listed one per line after `header` as '<label>. text'; lines without the next label continue one."""
    _, sep, block = text.rpartition(header)
    if not sep:
        raise ValueError(f"no {header.strip()!r} block in the problem")
    options: list[str] = []
    for line in block.strip("\n").split("\n"):
        prefix = f"{labels(len(options))}."
        if line.startswith(prefix):
            options.append(line[len(prefix) :].strip())
        elif options:
            options[-1] += "\n" + line
        else:
            raise ValueError(f"option list does not start with {prefix!r}")
    if len(options) < 2:
        raise ValueError("fewer than two options")
    return tuple(o.strip() for o in options)


def _letter(i: int) -> str:
    return chr(ord("A") + i)


def _gold_option(choices: Sequence[str], solution: str) -> str:
    """The option whose text is the solution (exactly, else up to case and spacing)."""
    if solution in choices:
        return solution
    by_norm = {normalize_text(c): c for c in choices}
    if normalize_text(solution) in by_norm:
        return by_norm[normalize_text(solution)]
    raise ValueError(f"solution {solution[:60]!r} is not one of the options")


def _with_options(question: str, header: str, labels: Sequence[str], choices: Sequence[str]) -> str:
    """The question as the original benchmark showed it to the user: stem, header, one labelled option per line."""
    listed = "\n".join(f"{label}. {text}" for label, text in zip(labels, choices, strict=True))
    return f"{question}\n\n{header}\n{listed}"


def _parse_mmlu(record: Mapping[str, Any]) -> Fields:
    if "choices" in record:  # hub: cais/mmlu
        choices = tuple(as_text(c, "choices") for c in record["choices"])
        question = _with_options(
            as_text(record["question"], "question"), "Choices:", [str(i) for i in range(len(choices))], choices
        )
        return Fields(question=question, answer=choices[int(record["answer"])], choices=choices)
    question = as_text(record["problem"], "problem")
    choices = _options_after(question, "Choices:\n", str)
    return Fields(
        question=question, answer=_gold_option(choices, as_text(record["solution"], "solution")), choices=choices
    )


def _parse_medqa(record: Mapping[str, Any]) -> Fields:
    if "options" in record:  # hub: GBaker/MedQA-USMLE-4-options, options as {letter: text}
        options = record["options"]
        pairs = sorted(options.items()) if isinstance(options, Mapping) else [(o["key"], o["value"]) for o in options]
        choices = tuple(as_text(v, "options") for _, v in pairs)
        question = _with_options(
            as_text(record["question"], "question"), "Options:", [str(k) for k, _ in pairs], choices
        )
        return Fields(
            question=question, answer=_gold_option(choices, as_text(record["answer"], "answer")), choices=choices
        )
    question = as_text(record["problem"], "problem")
    choices = _options_after(question, "Options:\n", _letter)
    return Fields(
        question=question, answer=_gold_option(choices, as_text(record["solution"], "solution")), choices=choices
    )


_PAREN_LABEL = re.compile(r"^\s*\(([A-Z])\)\s*")


def _logiqa_choices(question: str) -> tuple[str, ...]:
    """Options inline after 'Answer Choices:' as '(A)text (B)text ...', up to the 'A: Among A through ...' cue.

    Ordered by label: a few original records list them out of order ('(A).. (C).. (B).. (D)..').
    """
    _, sep, block = question.rpartition("Answer Choices:")
    if not sep:
        raise ValueError("no 'Answer Choices:' in the problem")
    block = re.split(r"\n\s*A:", block, maxsplit=1)[0]
    markers = list(re.finditer(r"\(([A-Z])\)", block))
    labels = [m.group(1) for m in markers]
    if len(labels) < 2 or sorted(labels) != [_letter(i) for i in range(len(labels))]:
        raise ValueError("options after 'Answer Choices:' are not labelled (A), (B), ... once each")
    ends = [m.start() for m in markers[1:]] + [len(block)]
    texts = {m.group(1): block[m.end() : end].strip() for m, end in zip(markers, ends, strict=True)}
    return tuple(texts[label] for label in sorted(texts))


def _parse_logiqa(record: Mapping[str, Any]) -> Fields:
    if "query" in record:  # hub: hails/agieval-logiqa-en, choices as '(A)text', gold as [index]
        choices = tuple(_PAREN_LABEL.sub("", as_text(c, "choices")).strip() for c in record["choices"])
        gold = record["gold"]
        index = int(gold[0] if isinstance(gold, Sequence) and not isinstance(gold, str) else gold)
        return Fields(question=as_text(record["query"], "query"), answer=choices[index], choices=choices)
    question, solution = as_text(record["problem"], "problem"), as_text(record["solution"], "solution")
    choices = _logiqa_choices(question)
    label = _PAREN_LABEL.match(solution)
    if label and ord(label.group(1)) - ord("A") < len(choices):
        return Fields(question=question, answer=choices[ord(label.group(1)) - ord("A")], choices=choices)
    return Fields(question=question, answer=_gold_option(choices, solution), choices=choices)


# ---------------------------------------------------------------- the task table


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: AnswerKind
    description: str  # what the simulated user is trying to do, in one line
    hub_id: str | None
    hub_config: str | None
    hub_split: str
    parser: Callable[[Mapping[str, Any]], Fields] = field(repr=False)
    aliases: tuple[str, ...] = ()  # also the folder names of the original cache layout
    generator: Callable[[int, int], list[Problem]] | None = field(default=None, repr=False)  # (n, seed)
    default_size: int = 200  # how many problems a generated task has when no limit asks for more

    def parse(self, record: Mapping[str, Any]) -> Problem:
        if "kind" in record and "question" in record:  # already a Problem record (`Problem.to_record`)
            problem = Problem.from_record(record)
            if problem.task != self.name:
                raise ValueError(f"record is for task {problem.task!r}, not {self.name!r}")
            return problem
        f = self.parser(record)
        pid = problem_id(self.name, f.question)
        return Problem(pid, self.name, f.question, f.answer, self.kind, f.choices, f.solution)


def _generate_arith(n: int, seed: int) -> list[Problem]:
    from memrl.envs.collab.arith import generate_arith  # imported late: arith builds on this module

    return generate_arith(n, seed)


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "math-500",
            AnswerKind.MATH,
            "You are trying to solve a competition math problem and want an exact final answer you can trust.",
            "HuggingFaceH4/MATH-500",
            None,
            "test",
            _parse_math,
            aliases=("math500", "math_500"),
        ),
        TaskSpec(
            "math-hard",
            AnswerKind.MATH,
            "You are trying to solve one of the hardest competition math problems and want an exact final answer.",
            "lighteval/MATH-Hard",
            None,
            "test",
            _parse_math,
            aliases=("math_hard", "mathhard"),
        ),
        TaskSpec(
            "logiqa",
            AnswerKind.CHOICE,
            "You are trying to answer a logical reasoning question by working out which lettered option is right.",
            "hails/agieval-logiqa-en",
            None,
            "test",
            _parse_logiqa,
        ),
        TaskSpec(
            "mmlu",
            AnswerKind.CHOICE,
            "You are trying to answer a multiple-choice exam question on an academic subject by picking one option.",
            "cais/mmlu",
            "all",
            "test",
            _parse_mmlu,
        ),
        TaskSpec(
            "medqa",
            AnswerKind.CHOICE,
            "You are trying to answer a medical licensing exam question about a patient by picking the right option.",
            "GBaker/MedQA-USMLE-4-options",
            None,
            "test",
            _parse_medqa,
        ),
        TaskSpec(
            "arith",
            AnswerKind.MATH,
            "You are trying to work out a short arithmetic or counting word problem and want the exact whole number.",
            None,
            None,
            "test",
            _parse_math,
            generator=_generate_arith,
        ),
    )
}

_ALIASES = {alias: spec.name for spec in TASKS.values() for alias in spec.aliases}


def get_task(name: str) -> TaskSpec:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in TASKS:
        return TASKS[key]
    close = closest(key, [*TASKS, *_ALIASES], cutoff=0.6)
    hint = f"did you mean {_ALIASES.get(close, close)!r}? " if close else ""
    raise ConfigError(f"unknown task {name!r}; {hint}valid tasks: {', '.join(sorted(TASKS))}")


# ---------------------------------------------------------------- loading


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _read_records(path: Path) -> list[Any]:
    """The records of one .json (a list, or {"data": [...]}), .jsonl or .parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        check_file(path, ConfigError)  # a FIFO would block pyarrow's open for ever
        try:
            import pyarrow.parquet as pq

            return list(pq.read_table(path).to_pylist())
        except (OSError, ValueError) as err:  # pyarrow's errors are ValueError/OSError kinds
            raise ConfigError(f"cannot read problems from {path}: {_one_line(err)}") from err
    if suffix not in (".json", ".jsonl"):
        raise ConfigError(f"unsupported problem file {path}: expected .json, .jsonl or .parquet")
    if suffix == ".jsonl":
        return read_jsonl(path, ConfigError, torn=False)
    data = parse_json(read_text(path, ConfigError), str(path), ConfigError)
    data = data.get("data") if isinstance(data, dict) else data
    if not isinstance(data, list):
        raise ConfigError(f'{path}: expected a list of records or {{"data": [...]}}')
    return data


_DATA_SUFFIXES = (".json", ".jsonl", ".parquet")


def _files_in(directory: Path, spec: TaskSpec) -> list[Path]:
    """The data files of a task folder; a folder of task folders (the original cache root) is entered first."""
    for sub in (spec.name, *spec.aliases):
        if (directory / sub).is_dir():
            directory = directory / sub
            break
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in _DATA_SUFFIXES)
    if not files:
        raise ConfigError(f"no .json/.jsonl/.parquet problem files for task {spec.name!r} in {directory}")
    return files


def _parse_all(spec: TaskSpec, records: Iterable[Any], origin: str) -> list[Problem]:
    problems: list[Problem] = []
    for i, record in enumerate(records):
        try:
            if not isinstance(record, Mapping):
                raise TypeError(f"expected an object, got {type(record).__name__}")
            problems.append(spec.parse(record))
        except (KeyError, ValueError, TypeError, IndexError) as err:
            reason = f"missing field {err}" if isinstance(err, KeyError) else _one_line(err)
            raise ConfigError(f"{origin}: record {i} is not a valid {spec.name} problem: {reason}") from err
    return problems


def _from_hub(spec: TaskSpec) -> list[Problem]:
    assert spec.hub_id is not None
    import datasets

    try:
        dataset = datasets.load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_split)
    except Exception as err:  # offline, unreachable, gated or missing: all leave the user the same fix
        raise ConfigError(
            f"cannot load {spec.hub_id} from the Hugging Face hub (offline or unreachable? {_one_line(err)[:160]}); "
            "pass a local .json/.jsonl/.parquet file as the problem source instead"
        ) from err
    return _parse_all(spec, dataset, f"{spec.hub_id}[{spec.hub_split}]")


def _dedupe(problems: Iterable[Problem]) -> list[Problem]:
    """First of each question: a benchmark listing one question twice must not put it on both sides of a split."""
    seen: set[str] = set()
    out = []
    for p in problems:
        key = normalize_text(p.question)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def sample(problems: Sequence[Problem], limit: int | None, seed: int) -> list[Problem]:
    """`limit` problems drawn with `seed`; a smaller limit gives a prefix of a larger one's draw."""
    if limit is None:
        return list(problems)
    if limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    return [problems[i] for i in order[:limit]]


def _source_files(spec: TaskSpec, source: str | Path) -> list[Path]:
    path = Path(source).expanduser()
    if not path.exists():
        raise ConfigError(f"problem file not found: {path}")
    return _files_in(path, spec) if path.is_dir() else [path]


def _parse_files(spec: TaskSpec, files: Iterable[Path]) -> list[Problem]:
    problems = []
    for f in files:
        records = _read_records(f)
        if not records:  # an empty table: later counts ("n_eval=1 but 0 problems") would not say which file
            raise ConfigError(f"{f}: holds no problems (no records)")
        problems += _parse_all(spec, records, str(f))
    return problems


def load_problems(
    task: str, source: str | Path | None = None, *, limit: int | None = None, seed: int = 0
) -> list[Problem]:
    """A task's problems from a local file or folder, the hub (no source), or its generator (arith).

    A release cache folder's trainset and testset files are merged (`problems_for` keeps them apart). Duplicated
    questions are dropped (first kept); `limit` then samples deterministically with `seed`.
    """
    spec = get_task(task)
    if source is not None:
        problems = _parse_files(spec, _source_files(spec, source))
    elif spec.generator is not None:
        problems = spec.generator(max(spec.default_size, limit or 0), 0)
    elif spec.hub_id is not None:
        problems = _from_hub(spec)
    else:
        raise ConfigError(f"task {spec.name!r} has no hub dataset: pass a local problem file")
    return sample(_dedupe(problems), limit, seed)


# ---------------------------------------------------------------- splits


def split_problems(problems: Sequence[Problem], n_eval: int | float, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, eval): `n_eval` problems (a count, or a fraction in (0, 1)) held out with `seed`, disjoint by question.

    Both keep the input order; problems sharing a question always land on the same side.
    """
    groups: dict[str, list[Problem]] = {}
    for p in problems:
        groups.setdefault(normalize_text(p.question), []).append(p)
    keys = list(groups)
    if isinstance(n_eval, bool) or not isinstance(n_eval, int | float):
        raise ConfigError(f"n_eval must be a count or a fraction, got {n_eval!r}")
    if isinstance(n_eval, float):
        if not 0 < n_eval < 1:
            raise ConfigError(f"n_eval as a fraction must be in (0, 1), got {n_eval}")
        n_eval = max(1, round(n_eval * len(keys))) if keys else 0
    if not 0 <= n_eval <= len(keys):
        raise ConfigError(f"n_eval={n_eval} but there are only {len(keys)} distinct problems")
    shuffled = keys[:]
    random.Random(seed).shuffle(shuffled)
    held_out = set(shuffled[:n_eval])
    train = [p for k in keys if k not in held_out for p in groups[k]]
    evaluation = [p for k in keys if k in held_out for p in groups[k]]
    return train, evaluation


# The original cache names each task's files by the side of its split: `trainset_size20_seed42.json`, `testset_...`.
RELEASE_SPLIT = {"train": "trainset", "eval": "testset"}


def release_split(files: Sequence[Path]) -> dict[str, list[Path]] | None:
    """A release cache's own split of a task folder's files by name (train: `trainset*`, eval: `testset*`), or None
    when no file is named so. A file named neither way beside them is refused: which side it is on is unknown."""
    sides = {side: [f for f in files if f.name.lower().startswith(prefix)] for side, prefix in RELEASE_SPLIT.items()}
    if not any(sides.values()):
        return None
    for f in files:
        if not any(f in named for named in sides.values()):
            raise ConfigError(
                f"{f}: neither a trainset nor a testset file of the release cache in {f.parent}; move it out, or "
                "pass --resplit to merge every file and split them again"
            )
    return sides


def problems_for(
    task: str,
    source: str | Path | None,
    split: Literal["train", "eval"],
    *,
    eval_problems: int,
    seed: int,
    resplit: bool = False,
) -> list[Problem]:
    """The problems of one side (`train` or `eval`) of a task's train/eval split.

    A release cache folder keeps its own split: train is its trainset files, eval its testset files (as the original
    evaluates every user on the whole testset), and `eval_problems` is not used. Any other source, or any source with
    `resplit`, is merged and `eval_problems` (at most half) are held out with `seed`.
    """
    spec = get_task(task)
    path = None if source is None or resplit else Path(source).expanduser()
    sides = release_split(_files_in(path, spec)) if path is not None and path.is_dir() else None
    if sides is None:
        problems = load_problems(task, source, seed=seed)
        train, evaluation = split_problems(problems, min(eval_problems, len(problems) // 2) or 1, seed)
        return evaluation if split == "eval" else train
    if not sides[split]:
        raise ConfigError(
            f"{path}: the release cache has no {RELEASE_SPLIT[split]} files of task {spec.name!r} for the {split} "
            "split; pass --resplit to split its other files instead"
        )
    train, evaluation = (_dedupe(_parse_files(spec, sides[side])) for side in ("train", "eval"))
    check_disjoint(train, evaluation)  # the release's sides are disjoint; an edited cache may not be
    return evaluation if split == "eval" else train


def check_disjoint(train: Iterable[Problem], evaluation: Iterable[Problem]) -> None:
    """Raise ConfigError when a problem (same id, or same question up to case and spacing) is in both sets."""
    check_splits_disjoint(
        train,
        evaluation,
        key=(lambda p: p.id, lambda p: normalize_text(p.question)),
        label=lambda p: p.id,
        message="train and eval problems overlap: {n} eval problem(s) also in train, e.g. {example}",
    )
