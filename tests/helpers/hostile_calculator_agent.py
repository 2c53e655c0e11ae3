"""The example calculator agent (``recipe/agent/examples/calculator_agent.py``), except that
about one episode in eight first sends ``/v1/completions`` a prompt holding the token id
``10**12``, catches the 400 and goes on: one malformed request must cost its agent a refusal,
never the run (before the endpoint's rule it ended the whole run)::

    python -m recipe env=calculator_agent \
        rollout.multi_turn.agent=tests/helpers/hostile_calculator_agent.py:run
"""

from __future__ import annotations

import zlib

import openai

from recipe.agent.examples.calculator_agent import run as calculator
from recipe.protocol import PromptRecord


async def run(client: openai.AsyncOpenAI, record: PromptRecord) -> float:
    # Episodes of one prompt share its uid: the client tells them apart.
    if zlib.crc32(f"{record.uid}/{id(client)}".encode()) % 8 == 0:
        try:
            await client.completions.create(model="policy", prompt=[1, 10**12])
        except openai.BadRequestError:
            pass  # refused, as it should be: the episode goes on
        else:
            raise AssertionError("a prompt with a token id past the vocabulary was served")
    return await calculator(client, record)
