"""Every prompt of the PAHF agent and its LLM persona user, in our own words.

Each builder returns chat messages. The decision is a letter on the first line (or `ASK: question`) and salience a
bare yes/no, forms even a 135M model follows; summaries and notes are JSON objects whose keys the `*_KEYS` tuples
list. The persona user answers in plain text (it plays a person, not a parser).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memrl.rollout.base import Message

ASK = "ask"
NO_NOTES = "No stored preference applies to this task."

SUMMARY_KEYS = ("summary",)
NOTE_KEYS = ("note",)

_DOMAIN = {
    "shopping": (
        "You are a shopping agent that buys one product for a user. You see up to three candidates (A, B, C), each "
        "described by a few features, and option D: buy nothing. The user accepts a product only when EVERY one of "
        "its features is one they prefer or accept; a single disliked feature makes it a bad buy. Choose D when no "
        "candidate passes that test."
    ),
    "embodied": (
        "You are a household robot helping one person in a home or office. You get their request, the objects you "
        "can see, and four candidate actions (A, B, C, D). Exactly one action is what this person wants; it "
        "often depends on their habits and on their current situation (tired, unwell, celebrating, cold, ...)."
    ),
}

_DECISION = """{domain}

# What you remember about this user
{summary}

# Request from {user}
{instruction}
{scene}
# Options
{options}
{clarification}
{rule}"""

_PICK = "Which option do you choose? Answer with a single letter ({letters})."
_ASK_RULE = (
    "If the request depends on personal taste and what you remember does not settle it, you may ask the user ONE "
    "short question first: reply with the single line `ASK: <your question>`.\n" + _PICK
)
_NO_ASK_RULE = _PICK
_ASKED_RULE = "Use the user's answer above. " + _PICK

_SUMMARY = """A user asked an assistant for something. Below are notes the assistant stored about this user in \
earlier tasks. Pull out only what helps with THIS request: preferences, dislikes, and the situations they apply to.

# Request
{instruction}

# Options
{options}

# Stored notes
{notes}

Reply with one JSON object and nothing around it:
{{"summary": "the relevant preferences in one to three sentences, or \\"none\\" if no note applies"}}"""

_SALIENCE = """An assistant received this message from a user:
"{feedback}"

Does the message reveal something personal about the user that is worth remembering for future tasks: a \
preference, a dislike, a habit, or a change of mind? Plain thanks, acknowledgements or a bare "wrong" are not.

Answer with one word: yes or no."""

_NOTE = """An assistant is keeping short notes about a user's preferences.

# The task
{instruction}
{exchange}
Write ONE short note (one sentence, at most 30 words) that states the user's preference this reveals, naming the \
user and the product or situation it applies to, so it is useful on its own in a later task.

Reply with one JSON object and nothing around it: {{"note": "..."}}"""

_MERGE = """Two pieces of information about the same user need to become one note.

# The stored note
{existing}

# New information
{new}

Write one concise note that keeps everything still true from both. Where they disagree, the new information \
wins: the user's preference has changed.

Reply with one JSON object and nothing around it: {{"note": "..."}}"""

_PERSONA_SYSTEM = """{persona}

Right now an assistant is working on this request of yours: "{instruction}"
It asks you one question before acting. Answer in one or two sentences, as yourself, consistently with your \
preferences above. Answer only what is asked: do not volunteer other preferences, and do not mention options, \
letters or rules."""


_PERSONA_FEEDBACK = """{persona}

You asked an assistant: "{instruction}"
It did this: {done}
That is not what you wanted: you wanted this: {wanted}
Tell the assistant in one or two sentences, as yourself, what you wanted instead and why, so it gets it right \
next time. Do not mention options or letters."""


def _lines(options: Mapping[str, str]) -> str:
    return "\n".join(f"{letter}) {text}" for letter, text in options.items())


def decision_messages(
    domain: str,
    user: str,
    instruction: str,
    options: Mapping[str, str],
    summary: str,
    *,
    scene: str = "",
    may_ask: bool,
    clarification: tuple[str, str] | None = None,
) -> list[Message]:
    """The agent's decision: an option letter, or `ASK: question` while it may still ask."""
    letters = ", ".join(options)
    if clarification is not None:
        question, answer = clarification
        exchange = f"\n# Your question and the user's answer\nYou: {question}\n{user}: {answer}\n"
        rule = _ASKED_RULE.format(letters=letters)
    else:
        exchange = ""
        rule = (_ASK_RULE if may_ask else _NO_ASK_RULE).format(letters=letters)
    prompt = _DECISION.format(
        domain=_DOMAIN[domain],
        summary=summary or NO_NOTES,
        user=user,
        instruction=instruction,
        scene=f"\n# What you see\n{scene}\n" if scene else "",
        options=_lines(options),
        clarification=exchange,
        rule=rule,
    )
    return [{"role": "user", "content": prompt}]


def summary_messages(instruction: str, options: Mapping[str, str], notes: Sequence[str]) -> list[Message]:
    listed = "\n".join(f"- {n}" for n in notes)
    prompt = _SUMMARY.format(instruction=instruction, options=_lines(options), notes=listed)
    return [{"role": "user", "content": prompt}]


def salience_messages(feedback: str) -> list[Message]:
    return [{"role": "user", "content": _SALIENCE.format(feedback=feedback.replace('"', "'"))}]


def note_messages(user: str, instruction: str, feedback: str, question: str | None = None) -> list[Message]:
    """A preference note from an answer to the agent's question (`question` given) or from post-action feedback."""
    if question is not None:
        exchange = f"\n# The assistant asked\n{question}\n\n# {user} answered\n{feedback}\n"
    else:
        exchange = f"\n# What {user} said after the assistant acted\n{feedback}\n"
    return [{"role": "user", "content": _NOTE.format(instruction=f"{user}: {instruction}", exchange=exchange)}]


def merge_messages(existing: str, new: str) -> list[Message]:
    return [{"role": "user", "content": _MERGE.format(existing=existing, new=new)}]


def persona_answer_messages(persona: str, instruction: str, question: str) -> list[Message]:
    """The LLM persona user answering the agent's one clarification question."""
    return [
        {"role": "system", "content": _PERSONA_SYSTEM.format(persona=persona.strip(), instruction=instruction)},
        {"role": "user", "content": question},
    ]


def persona_feedback_messages(persona: str, instruction: str, done: str, wanted: str) -> list[Message]:
    """The LLM persona user correcting a wrong action (embodied post-action feedback)."""
    prompt = _PERSONA_FEEDBACK.format(persona=persona.strip(), instruction=instruction, done=done, wanted=wanted)
    return [{"role": "user", "content": prompt}]
