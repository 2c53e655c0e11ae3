"""Agents the integration tests load by file path (``rollout.multi_turn.agent``), written
against the `openai` client as a user's agent is. The model is random, so its turns are
text, not tool calls: the agent answers each turn itself, with a tool result for a call or
a nudge for text, for ``TURNS`` turns.

By prompt uid (crc32 % 8):

    0       branches: its last request summarises the history (a second segment)
    1       raises after its first turn (its episodes end as env_error)
    2, 3    one-message conversations back to back (a segment each) until the weights
            version answering changes (``system_fingerprint``), at most ``SHORT_REQUESTS``:
            groups still running when a sync comes, whose requests it finds mid-turn. Back
            to back, the engine stays busy, so a sync finds requests mid-turn; the cap is
            high enough that an episode outlasts the time to the next sync (at 40, all the
            trained ones once finished within one version; pacing them instead left the
            engine idle when a sync came)
    4       one conversation, with ``HOSTILE_REQUESTS`` bad requests on the way (a token id
            past any vocabulary, an assistant message whose ``tool_calls`` holds a string):
            each is refused with 400 and the conversation goes on (before the endpoint's
            rule, either ended the whole run)
    others  one conversation

The reward is a digest of the last turn's content as the agent received it, so a test can
recompute it from the trained tokens: equal only when the tokens trained are the text the
agent was given.
"""

from __future__ import annotations

import zlib

import openai

TURNS = 3
SHORT_REQUESTS = 80
HOSTILE_REQUESTS = 2
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add.",
            "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
        },
    }
]
FEW_SHOT = [
    {"role": "user", "content": "2+2?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "4"},
]


def digest(text: str) -> float:
    """The reward of a last turn whose content is ``text``."""
    return (zlib.crc32(text.encode()) % 1000) / 1000


def kind(uid: str) -> int:
    return zlib.crc32(uid.encode()) % 8


async def run(client, record) -> float:
    if kind(record.uid) in (2, 3):
        return await _short_requests(client, record)
    messages = [*FEW_SHOT, {"role": "user", "content": record.prompt}]
    content = ""
    if kind(record.uid) == 4:
        await _refused(client.completions.create(model="policy", prompt=[1, 10**12]))
    for turn in range(TURNS):
        if turn == TURNS - 1 and kind(record.uid) == 0:
            messages = [{"role": "user", "content": f"So far: {content[:20]!r}. Finish."}]
        out = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, temperature=0.0
        )
        message = out.choices[0].message
        content = message.content or ""
        if kind(record.uid) == 1:
            raise RuntimeError("the agent's tool server is down")
        if kind(record.uid) == 4 and turn == 0:
            bad = {"role": "assistant", "content": "x", "tool_calls": ["x"]}
            await _refused(
                client.chat.completions.create(
                    model="policy", messages=[*messages, message.model_dump(), bad]
                )
            )
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "0"})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Use the tool."})
    return digest(content)


async def _refused(request) -> None:
    """``request`` is answered 400 (the agent's mistake), and the episode goes on."""
    try:
        await request
    except openai.BadRequestError:
        return
    raise AssertionError("a malformed request was served")


async def _short_requests(client, record) -> float:
    content, first = "", None
    for part in range(SHORT_REQUESTS):
        messages = [{"role": "user", "content": f"{record.prompt} (part {part})"}]
        out = await client.chat.completions.create(model="policy", messages=messages)
        content = out.choices[0].message.content or ""
        first = first or out.system_fingerprint
        if out.system_fingerprint != first:
            break
    return digest(content)
