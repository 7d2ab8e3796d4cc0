"""Every prompt of the MS-TOD pipeline and its simulator, in our own words.

Each builder returns chat messages. Roles whose reply the code parses ask for one JSON object; each `*_KEYS`
tuple lists the keys that reply must carry. The reader and the user simulator answer in plain text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memrl.rollout.base import Message

INTENT_KEYS = ("intent",)
REASONER_KEYS = ("missing_slots",)
SUPERVISOR_KEYS = ("resolved_slots",)
QUALITY_KEYS = ("score",)

NO_MEMORY = "(nothing relevant remembered)"
NONE_MISSING = "(none: the conversation already covers every detail)"

_INTENT = """Read the start of a conversation between a user and a booking assistant and name what the user wants \
done, as a short command phrase (3 to 12 words) that keeps the concrete names the user gave, for example \
"book a table at Golden Wok in San Mateo" or "order a shared ride to the airport".

# Conversation
{conversation}

Reply with one JSON object and nothing around it:
{{"intent": "the command phrase"}}"""

_REASONER = """You help a booking assistant find out which details of a task the conversation has not settled yet.

# The task: {intent} ({intent_description})
Details this task can take (name: meaning):
{slots}

# Conversation
{conversation}

# Think it through
1. Go through the details listed above one by one.
2. For each, look for a value the user gave or agreed to in the conversation.
3. Keep only the details that still have no value.

Reply with one JSON object and nothing around it. Use the detail names exactly as listed:
{{"reasoning": "one short line per detail: settled or not, and where", "missing_slots": ["name", "..."]}}"""

_READER = """You are a booking assistant talking with a returning user. You remember facts from your earlier \
conversations with them; use them so the user does not have to repeat themselves.

# Facts remembered from earlier conversations
{memory}

# Details the conversation has not settled yet
{missing}

# What to do
Write the assistant's next message. Continue the conversation naturally and, for each unsettled detail, propose \
the remembered value so the user only has to confirm it; if nothing is remembered for a detail, ask for it. Restate \
the details already agreed, so the user sees the whole booking in one message. Reply with the message only, in two \
to four sentences."""

_USER = """You play a customer talking to a booking assistant. Answer the assistant's last message as this customer \
would, in one or two short sentences.

# What you want (the correct values)
{goal}

# What the assistant still has missing or wrong
{outstanding}

Tell the assistant the correct value of one or two of those details. Do not invent values, do not mention details \
that are already right, and do not describe these instructions."""

_SUPERVISOR = """You check a booking conversation against the customer's goal. For each detail listed below, decide \
whether the assistant's messages now state the correct value.

# Details to check (name: correct value)
{slots}

# Conversation
{conversation}

Reply with one JSON object and nothing around it; list only names from above whose correct value the assistant \
has stated:
{{"reasoning": "one short line per detail", "resolved_slots": ["name", "..."]}}"""

_QUALITY = """Rate an assistant's reply in a booking conversation on a scale from 1 (useless) to 10 (excellent). \
Judge how fluent it reads, how coherently it follows the conversation, and how informative it is about the \
customer's goal (does it state the right details?).

# Customer's goal
{goal}

# Conversation before the reply
{conversation}

# Reply to rate
{response}

Reply with one JSON object and nothing around it:
{{"score": an integer from 1 to 10, "reasoning": "one or two sentences"}}"""


def render_turns(turns: Sequence[Mapping[str, str]]) -> str:
    """A transcript as the prompts show it; turns are `{"speaker", "utterance"}` mappings."""
    return "\n".join(f"{t['speaker'].upper()}: {t['utterance']}" for t in turns) or "(no turns yet)"


def _lines(items: Mapping[str, str]) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in items.items())


def _ask(prompt: str) -> list[Message]:
    return [{"role": "user", "content": prompt}]


def intent_messages(context: Sequence[Mapping[str, str]]) -> list[Message]:
    return _ask(_INTENT.format(conversation=render_turns(context)))


def reasoner_messages(
    context: Sequence[Mapping[str, str]], intent: str, intent_description: str, slots: Mapping[str, str]
) -> list[Message]:
    """`slots`: every slot the intent takes, name -> schema description."""
    return _ask(
        _REASONER.format(
            intent=intent,
            intent_description=intent_description,
            slots=_lines(slots),
            conversation=render_turns(context),
        )
    )


def reader_messages(
    conversation: Sequence[Mapping[str, str]], a_core: Sequence[str], missing: Mapping[str, str]
) -> list[Message]:
    """The reader sees only the remembered answers (A_core), never the questions they came from."""
    turns: list[Message] = [
        {"role": "assistant" if t["speaker"] == "assistant" else "user", "content": t["utterance"]}
        for t in conversation
    ]
    if not turns or turns[-1]["role"] == "assistant":  # chat templates expect the user to speak last
        turns.append({"role": "user", "content": "Please go on."})
    return [reader_system(a_core, missing), *turns]


def reader_system(a_core: Sequence[str], missing: Mapping[str, str]) -> Message:
    """The reader's instructions: the remembered answers and the unsettled slots (slot -> how it is named)."""
    memory = "\n".join(f"- {a}" for a in a_core) or NO_MEMORY
    return {"role": "system", "content": _READER.format(memory=memory, missing=_lines(missing) or NONE_MISSING)}


def user_messages(
    conversation: Sequence[Mapping[str, str]], goal: Mapping[str, str], outstanding: Mapping[str, str]
) -> list[Message]:
    """The simulator's view: its instructions, then the conversation with the roles swapped."""
    system: Message = {"role": "system", "content": _USER.format(goal=_lines(goal), outstanding=_lines(outstanding))}
    flipped: list[Message] = [
        {"role": "user" if t["speaker"] == "assistant" else "assistant", "content": t["utterance"]}
        for t in conversation
    ]
    return [system, *flipped]


def supervisor_messages(conversation: Sequence[Mapping[str, str]], slots: Mapping[str, str]) -> list[Message]:
    """`slots`: the outstanding slots, name -> goal value."""
    return _ask(_SUPERVISOR.format(slots=_lines(slots), conversation=render_turns(conversation)))


def quality_messages(context: Sequence[Mapping[str, str]], goal: Mapping[str, str], response: str) -> list[Message]:
    return _ask(_QUALITY.format(goal=_lines(goal), conversation=render_turns(context), response=response))
