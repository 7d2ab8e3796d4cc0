"""Every prompt of the collab environment, in our own words, with the output keys of the paper's contracts.

Each builder returns chat messages; each `*_KEYS` tuple lists the JSON keys its reply must carry.
"""

from __future__ import annotations

from collections.abc import Sequence

from memrl.rewards.format import ReplyFormat
from memrl.rollout.base import Message

TERMINATE = "[[DONE]]"  # what the LLM user simulator says when it ends the session
NO_NOTES = "(no notes yet)"

AGENT_KEYS = ("user_preferences_reasoning", "reasoning", "response")
RETRIEVAL_KEYS = ("reasoning", "relevant_notes")
USER_KEYS = (
    "preference_1_satisfied",
    "preference_2_satisfied",
    "preference_3_satisfied",
    "enforce_preferences",
    "reasoning",
    "draft_answer",
    "should_terminate",
    "response",
)

_AGENT = """You help a user solve a problem: maths, logic, knowledge questions, writing or code.

# What you know about this user
{knowledge}

# How to work
- Only the user sees the whole problem: if their message is vague or incomplete, ask before you answer.
- Help them reach a correct answer, in the form this user likes: a reply they cannot use costs them a turn.

{reply_format}"""

# How the agent writes its reply: the paper's JSON contract, or the message alone (small models on CPU spend their
# budget on the JSON's scaffolding and fail to close it).
_REPLY_FORMATS = {
    "json": """Reply with one JSON object and nothing around it (double quotes, quotes inside strings escaped, \
newlines as \\n), within {max_tokens} tokens:
{{"user_preferences_reasoning": "which known preferences of this user apply here, and how you will meet them", \
"reasoning": "two or three sentences: do you know enough, and what should this reply do?", \
"response": "the message the user will read"}}""",
    "text": """Reply with the message the user will read, as plain text, within {max_tokens} tokens.""",
}

_KNOWLEDGE = {
    "none": "Nothing yet: this is a new user.",
    "notes": "Notes you kept from earlier sessions with this user:\n{notes}",
    "oracle": "The user's interaction preferences, as they would state them:\n{notes}",
    "history": "Transcripts of your earlier sessions with this user:\n{notes}",
}

_RETRIEVAL = """You pick, from an assistant's notes about a user, the parts that matter for the assistant's next reply.

# Conversation so far
{conversation}

# The assistant's notes about this user
{notes}

Copy out only the notes that bear on the next reply (how to format it, what tone, how much to cover). \
Reply with one JSON object and nothing around it:
{{"reasoning": "why these notes apply", "relevant_notes": "the selected notes, verbatim"}}"""

_REFLECTION = """A session with a user you help over many sessions has just ended. Update your notes on how this \
user wants you to work, so the next session goes better.

# Notes so far
{notes}

# The session
{conversation}

# Rules
- Find each time the user asked you to answer differently, and what they wanted instead.
- For each preference, write what to do next time and when it applies.
- Keep the useful old notes; merge or refine them. Record only preferences the user showed; do not guess.

Reply with one JSON object and nothing around it:
{{"user_preferences_reasoning": "what this session shows about the user's preferences", \
"agent_notes": "the full updated notes: each preference, how to meet it, when it applies"}}"""

_USER = """You play a user who is solving a problem with the help of an AI assistant. Only you can see the problem. \
Stay in character, follow your preferences strictly, and output JSON as described at the end.

# Your problem ({task})
{problem}
The assistant does not see this text. Do not paste it; describe it in your own words, a little at a time.

# Who you are
{persona}

# How you want the assistant to behave
1. {preference_1}
2. {preference_2}
3. {preference_3}

# Rules for enforcing your preferences
- While the assistant is still asking questions to understand the problem, just answer them; do not judge format yet.
- Once it is answering, every reply must meet all three preferences. If one is not met, your whole message is a \
request to fix it: no answers, no new information, no progress.
- While you are enforcing, keep your draft answer exactly as it was and do not end the session.

# Your draft answer
Keep a draft of your final answer. It starts as "I don't know". Change it only when a reply that meets all your \
preferences teaches you something about the answer.

# Style
Be brief and a little vague at first; let the assistant ask. Sound like a real person in this conversation.

# Ending
End the session when your draft is a good answer, or when the assistant clearly cannot help further \
(never while you are enforcing a preference). To end, set "should_terminate" to true and reply "{terminate}".

# Output: exactly one JSON object, nothing around it
{{
  "preference_1_satisfied": "is preference 1 met by the last reply, and why",
  "preference_2_satisfied": "is preference 2 met by the last reply, and why",
  "preference_3_satisfied": "is preference 3 met by the last reply, and why",
  "enforce_preferences": true or false,
  "reasoning": "two or three sentences: must you enforce? if not, how does your draft change? are you done?",
  "draft_answer": "your current draft answer",
  "should_terminate": true or false,
  "response": "your message to the assistant"
}}"""


def render_conversation(turns: Sequence[Message]) -> str:
    """A transcript as the reflection and retrieval prompts show it."""
    return "\n".join(f"{t['role'].upper()}: {t['content']}" for t in turns)


def agent_messages(
    knowledge_kind: str, notes: str, turns: Sequence[Message], max_tokens: int, reply: ReplyFormat = "json"
) -> list[Message]:
    """The agent's view: system prompt with what it knows and how to reply, then the conversation from its side."""
    knowledge = _KNOWLEDGE[knowledge_kind].format(notes=notes or NO_NOTES)
    system = _AGENT.format(knowledge=knowledge, reply_format=_REPLY_FORMATS[reply].format(max_tokens=max_tokens))
    return [{"role": "system", "content": system}, *turns]


def retrieval_messages(notes: str, turns: Sequence[Message]) -> list[Message]:
    prompt = _RETRIEVAL.format(conversation=render_conversation(turns), notes=notes)
    return [{"role": "user", "content": prompt}]


def reflection_messages(notes: str, turns: Sequence[Message]) -> list[Message]:
    """The session-level reflection prompt; the reflection pipeline trains models on exactly this input."""
    prompt = _REFLECTION.format(notes=notes or NO_NOTES, conversation=render_conversation(turns))
    return [{"role": "user", "content": prompt}]


def user_messages(
    task: str, problem: str, persona: str, preferences: Sequence[str], turns: Sequence[Message]
) -> list[Message]:
    """The simulator's view: its system prompt, then the conversation with the roles swapped."""
    system = _USER.format(
        task=task,
        problem=problem,
        persona=persona,
        preference_1=preferences[0],
        preference_2=preferences[1],
        preference_3=preferences[2],
        terminate=TERMINATE,
    )
    flipped: list[Message] = [
        {"role": "assistant" if t["role"] == "user" else "user", "content": t["content"]} for t in turns
    ]
    if not flipped:  # the user opens the session
        flipped = [{"role": "user", "content": "(The assistant is waiting for you to describe your problem.)"}]
    return [{"role": "system", "content": system}, *flipped]
