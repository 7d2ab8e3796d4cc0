"""Session writers: a `SessionPlan` in, an MS-TOD `Session` out.

`TemplateWriter` is deterministic (its phrasing is drawn from a generator seeded by the run seed and the session key)
and annotates every user turn with the slot values it states. `LLMWriter` asks a chat model for the turns before the
confirmation, checks that the user states exactly the planned values, retries once, and falls back to the template
for that session when the model still gets it wrong. The confirmation and closing turns are always templated, so the
gold confirmation state is exact whoever wrote the rest.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from memrl.data_gen.tod.plan import SessionPlan
from memrl.envs.tod.formats import ConfirmationState, Session, Turn
from memrl.envs.tod.schema import Schemas, boolean_clause, intent_phrase, is_boolean, slot_phrase, slot_question
from memrl.envs.tod.values import mentions
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import parse_json_object

Written = tuple[Session, bool]  # the session, and whether a model failed it so the template wrote it
MIN_TURNS = 6  # turns of an incomplete or updating session (a model writes at least 3 before a confirmation)


class SessionWriter(Protocol):
    """Turns plans into sessions, yielding (session, whether a model failed it and the template wrote it) in order."""

    fallbacks: int

    def write(self, plan: SessionPlan) -> Session: ...

    def write_many(self, plans: Sequence[SessionPlan]) -> Iterator[Written]: ...


class _Phrasing:
    """Sentences built from schema descriptions; every value is quoted verbatim so it can be matched later."""

    def __init__(self, schemas: Schemas, plan: SessionPlan) -> None:
        self.schemas = schemas
        self.plan = plan
        self.service = plan.goal.service

    def phrase(self, slot: str) -> str:
        return slot_phrase(self.schemas.slot(self.service, slot))

    def question(self, slot: str) -> str:
        return slot_question(self.schemas.slot(self.service, slot))

    def intent(self) -> str:
        return intent_phrase(self.schemas.intent(self.service, self.plan.goal.intent))

    def fact(self, slot: str, value: str) -> str:
        """The slot and its value as a clause: 'the date for the reservation is March 3rd'."""
        spec = self.schemas.slot(self.service, slot)
        clause = boolean_clause(spec) if is_boolean(spec) else None
        if clause:
            return f"'{clause}' is {value}"
        return f"the {self.phrase(slot)} is {value}"

    def state(self, rng: random.Random, slot: str, value: str, tentative: bool = False) -> str:
        spec = self.schemas.slot(self.service, slot)
        if is_boolean(spec) and boolean_clause(spec):
            return f"On whether {boolean_clause(spec)}: {value}."
        phrase = self.phrase(slot)
        if tentative:
            return rng.choice(
                [
                    f"I think the {phrase} will be {value}, but that may still change.",
                    f"For now, put {value} as the {phrase}; I'm not completely sure yet.",
                ]
            )
        return rng.choice(
            [
                f"The {phrase} is {value}.",
                f"Please put {value} as the {phrase}.",
                f"For the {phrase}, {value}.",
                f"Make the {phrase} {value}, please.",
            ]
        )


class TemplateWriter:
    """Deterministic sessions from sentence templates; `fallbacks` stays 0."""

    def __init__(self, schemas: Schemas, seed: int = 0) -> None:
        self.schemas = schemas
        self.seed = seed
        self.fallbacks = 0

    def write(self, plan: SessionPlan) -> Session:
        rng = random.Random(f"{self.seed}/{plan.key}")  # per session: the same text whatever ran before
        say = _Phrasing(self.schemas, plan)
        if plan.stage == "incomplete":
            turns = self._incomplete(plan, say, rng)
        elif plan.stage == "updating":
            turns = self._updating(plan, say, rng)
        else:
            return confirming_session(plan, self.schemas, self._confirming_context(plan, say, rng), rng)
        return make_session(plan, turns)

    def write_many(self, plans: Sequence[SessionPlan]) -> Iterator[Written]:
        for plan in plans:
            yield self.write(plan), False

    def _incomplete(self, plan: SessionPlan, say: _Phrasing, rng: random.Random) -> list[Turn]:
        anchor, *rest = list(plan.states)
        opening = rng.choice([f"Hi! I'd like to {say.intent()}.", f"Hello, I want to {say.intent()}."])
        turns = [user(f"{opening} {say.state(rng, anchor, plan.states[anchor])}", {anchor: plan.states[anchor]})]
        for slot in rest:
            turns.append(assistant(rng.choice(["Sure.", "Okay.", "Got it."]) + " " + say.question(slot)))
            value = plan.states[slot]
            turns.append(user(say.state(rng, slot, value, tentative=slot in plan.preliminary), {slot: value}))
        if plan.open_slots:
            turns.append(assistant(f"Noted. {say.question(plan.open_slots[0])}"))
            turns.append(
                user(
                    rng.choice(
                        [
                            "I haven't decided that yet. I'll come back to you about the rest.",
                            "Not sure yet, let me check and get back to you later.",
                        ]
                    )
                )
            )
        turns += closing(rng)
        return turns

    def _updating(self, plan: SessionPlan, say: _Phrasing, rng: random.Random) -> list[Turn]:
        anchor, *rest = list(plan.states)
        turns = [
            user(
                f"Hi, it's me again about my plan to {say.intent()}. {say.state(rng, anchor, plan.states[anchor])}",
                {anchor: plan.states[anchor]},
            ),
            assistant(rng.choice(["Welcome back. What would you like to add?", "Good to hear from you. Go ahead."])),
        ]
        corrections = [s for s in rest if s in plan.corrects]
        for slot in corrections + [s for s in rest if s not in plan.corrects]:
            value = plan.states[slot]
            if slot in plan.corrects:
                text = f"I said {plan.corrects[slot]} earlier, but that changed: {say.fact(slot, value)}."
            else:
                text = say.state(rng, slot, value)
            turns.append(user(text, {slot: value}))
            turns.append(assistant(rng.choice(["Understood, I've updated that.", "Thanks, noted."])))
        turns[-1] = assistant(turns[-1].utterance + " Anything else?")
        turns += [user("No, that's all for now."), assistant("Alright. Talk to you soon.")]
        return turns

    def _confirming_context(self, plan: SessionPlan, say: _Phrasing, rng: random.Random) -> list[Turn]:
        anchor, *rest = list(plan.states)
        turns = [
            user(
                f"Hi, I'm ready to go ahead and {say.intent()}. {say.state(rng, anchor, plan.states[anchor])}",
                {anchor: plan.states[anchor]},
            ),
            assistant(rng.choice(["Sure, let me pull up what we discussed.", "Of course, one moment."])),
        ]
        if rest:
            text = " ".join(say.state(rng, s, plan.states[s]) for s in rest)
            turns.append(user(f"One more thing. {text}", {s: plan.states[s] for s in rest}))
        else:
            turns.append(user(rng.choice(["Thanks, please go ahead.", "Great, thank you."])))
        return turns


def user(text: str, slots: dict[str, str] | None = None) -> Turn:
    return Turn(speaker="user", utterance=text, slots=slots or {})


def assistant(text: str) -> Turn:
    return Turn(speaker="assistant", utterance=text)


def closing(rng: random.Random) -> list[Turn]:
    return [
        assistant(rng.choice(["I've noted all of that. Anything else for now?", "Noted. Anything else for now?"])),
        user(rng.choice(["No, that's all for today. Thanks!", "Nothing else, thank you."])),
        assistant(rng.choice(["You're welcome. Talk to you later.", "Happy to help. Bye for now."])),
    ]


def make_session(plan: SessionPlan, turns: list[Turn], state: ConfirmationState | None = None) -> Session:
    return Session(
        session_id=plan.session_id,
        reference_dialogue_id=plan.goal.reference_dialogue_id,
        exist_confirmation=state is not None,
        intent=plan.goal.intent,
        service=plan.goal.service,
        turns=turns,
        confirmation_state=state,
        stage=plan.stage,
    )


def confirmation_text(plan: SessionPlan, schemas: Schemas) -> str:
    say = _Phrasing(schemas, plan)
    facts = "; ".join(say.fact(slot, value) for slot, value in plan.goal.slots.items())
    return f"Let me confirm: you want to {say.intent()}, where {facts}. Is that right?"


def confirming_session(plan: SessionPlan, schemas: Schemas, context: list[Turn], rng: random.Random) -> Session:
    """The context, then the templated confirmation (every goal value), the user's agreement and a closing turn."""
    turns = [*context, assistant(confirmation_text(plan, schemas))]
    state = ConfirmationState(slot_values=dict(plan.goal.slots), confirmation_utterance_id=len(context))
    turns.append(user(rng.choice(["Yes, that's all correct.", "Yes, exactly. Please go ahead."])))
    turns.append(assistant(rng.choice(["Done, it's all set.", "All booked. Have a good day!"])))
    return make_session(plan, turns, state)


# --- LLM writer ---------------------------------------------------------------------------------------------------

WRITER_SYSTEM = (
    "You write realistic dialogues between a user and a task assistant (a booking or reservation service). "
    "Answer with one JSON object only, no prose."
)


def writer_prompt(plan: SessionPlan, schemas: Schemas) -> str:
    """What the model must write for one session, with the exact values the user has to say."""
    say = _Phrasing(schemas, plan)
    facts = "\n".join(f'- {say.phrase(s)}: "{v}"' for s, v in plan.states.items())
    forbidden = [v for s, v in plan.goal.slots.items() if s not in plan.states]
    lines = [f"The user wants to {say.intent()}."]
    if plan.stage == "incomplete":
        lines.append(
            "This is the first conversation about it. The user gives these details and nothing else"
            + (", and leaves the rest for a later conversation" if plan.open_slots else "")
            + ":"
        )
    elif plan.stage == "updating":
        lines.append("The user comes back to the assistant to continue planning. The user gives these details:")
    else:
        lines.append(
            "The user comes back to finalise it and mentions only these details (the assistant already knows "
            "the rest from earlier conversations):"
        )
    lines.append(facts)
    for slot, old in plan.corrects.items():
        lines.append(f'Earlier the user had said "{old}" for the {say.phrase(slot)}; now they change it.')
    if plan.preliminary:
        lines.append("The user sounds unsure about " + ", ".join(say.phrase(s) for s in plan.preliminary) + ".")
    if forbidden:
        lines.append("The user must NOT say any of: " + ", ".join(f'"{v}"' for v in forbidden) + ".")
    n = 3 if plan.stage == "confirming" else MIN_TURNS
    ending = (
        "End with a user turn, right before the assistant would read back the booking for confirmation."
        if plan.stage == "confirming"
        else "End politely; nothing gets booked in this conversation."
    )
    lines += [
        f"Write at least {n} turns, starting with the user and alternating. Quote each value exactly as given. "
        + ending,
        'Format: {"turns": [{"speaker": "user", "utterance": "..."}, {"speaker": "assistant", "utterance": "..."}]}',
    ]
    return "\n".join(lines)


@dataclass
class LLMWriter:
    """Turns before the confirmation from a chat model; a session it fails twice is templated and counted."""

    backend: ChatBackend
    schemas: Schemas
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.7, max_tokens=768))
    seed: int = 0
    retries: int = 1
    fallbacks: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.template = TemplateWriter(self.schemas, self.seed)

    def messages(self, plan: SessionPlan) -> list[Message]:
        return [
            {"role": "system", "content": WRITER_SYSTEM},
            {"role": "user", "content": writer_prompt(plan, self.schemas)},
        ]

    def write(self, plan: SessionPlan) -> Session:
        return next(self.write_many([plan]))[0]

    def write_many(self, plans: Sequence[SessionPlan]) -> Iterator[Written]:
        """One batched request per attempt for all sessions still unwritten, then the template for the rest."""
        done: dict[int, Session] = {}
        todo = list(range(len(plans)))
        for _attempt in range(1 + self.retries):
            if not todo:
                break
            replies = self.backend.generate([self.messages(plans[i]) for i in todo], self.params)
            failed = []
            for i, reply in zip(todo, replies, strict=True):
                session = self.parse(plans[i], reply.text)
                if isinstance(session, Session):
                    done[i] = session
                else:
                    self.failure_reasons[session] = self.failure_reasons.get(session, 0) + 1
                    failed.append(i)
            todo = failed
        for i, plan in enumerate(plans):
            if i in done:
                yield done[i], False
            else:
                self.fallbacks += 1
                yield self.template.write(plan), True

    def parse(self, plan: SessionPlan, text: str) -> Session | str:
        """The session the reply describes, or why it cannot be used."""
        parsed = parse_json_object(text, required=["turns"])
        if not parsed.ok:
            return "unparsed"
        raw: Any = parsed.data["turns"]  # type: ignore[union-attr]
        if not isinstance(raw, list):
            return "no turn list"
        turns = []
        for item in raw:
            if not isinstance(item, dict) or not isinstance(item.get("utterance"), str):
                return "malformed turn"
            speaker = str(item.get("speaker", "")).lower()
            if speaker not in ("user", "assistant") or not item["utterance"].strip():
                return "malformed turn"
            turns.append(Turn(speaker=speaker, utterance=item["utterance"].strip()))  # type: ignore[arg-type]
        need = 3 if plan.stage == "confirming" else MIN_TURNS
        if len(turns) < need or turns[0].speaker != "user":
            return "too few turns"
        if plan.stage == "confirming" and turns[-1].speaker != "user":
            turns = turns[:-1] if len(turns) > need else turns
            if turns[-1].speaker != "user":
                return "context does not end with the user"
        annotated = annotate(turns, plan)
        if annotated is None:
            return "missing value"
        forbidden = [v for s, v in plan.goal.slots.items() if s not in plan.states]
        stated = {v.casefold() for v in plan.states.values()}
        if any(
            mentions(t.utterance, v) for t in annotated for v in forbidden if v.casefold() not in stated and len(v) > 2
        ):
            return "leaked value"
        if plan.stage == "confirming":
            rng = random.Random(f"{self.seed}/{plan.key}")
            return confirming_session(plan, self.schemas, annotated, rng)
        return make_session(plan, annotated)


def annotate(turns: Sequence[Turn], plan: SessionPlan) -> list[Turn] | None:
    """Tag the first user turn that states each planned value; None when a value is never stated."""
    slots: list[dict[str, str]] = [{} for _ in turns]
    for slot, value in plan.states.items():
        hit = next((i for i, t in enumerate(turns) if t.speaker == "user" and mentions(t.utterance, value)), None)
        if hit is None:
            return None
        slots[hit][slot] = value
    return [Turn(speaker=t.speaker, utterance=t.utterance, slots=s) for t, s in zip(turns, slots, strict=True)]
