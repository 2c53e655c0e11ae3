"""A small multi-turn agent the LoRA integration test loads by file path
(``rollout.multi_turn.agent``), written against the `openai` client as a user's agent is:
``TURNS`` chat requests, each answered with a nudge, so every episode has several model
turns and some of them run after a push. The reward is a digest of the last content (it
varies within a group, so the adapter trains away from zero)."""

from __future__ import annotations

import zlib

TURNS = 3


async def run(client, record) -> float:
    messages = [{"role": "user", "content": record.prompt}]
    content = ""
    for _ in range(TURNS):
        out = await client.chat.completions.create(model="policy", messages=messages)
        content = out.choices[0].message.content or ""
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": "Go on."},
        ]
    return (zlib.crc32(content.encode()) % 1000) / 1000
