"""The calculator task driven by an agent written against the OpenAI API, as a user's agent
is: ``python -m recipe env=calculator_agent``.

The same episodes as the built-in ``calculator`` environment (``recipe.agent.builtin``), on
the tiny model warm-started on them, but the loop is the agent's own: it asks
``/v1/completions`` for the model's next turn (a base model has no chat template, so the
conversation is text), runs the calculator tool on it and sends the whole text back with the
tool's answer appended. The endpoint recognises the text it returned and appends only the
tool's answer, so the trained tokens are the ones the engine sampled.
"""

from __future__ import annotations

import openai

from recipe.data.calculator import calculator_step
from recipe.protocol import PromptRecord

MAX_CALLS = 8
"""Turns the agent asks for at most (the run's ``max_assistant_turns`` may stop it first)."""


async def run(client: openai.AsyncOpenAI, record: PromptRecord) -> float:
    """Reward 1 for the right final answer, 0 otherwise (a wrong one, or none in time)."""
    prompt = str(record.prompt)
    for _ in range(MAX_CALLS):
        try:
            out = await client.completions.create(model="policy", prompt=prompt)
        except openai.BadRequestError:  # the episode's budget is spent
            return 0.0
        text = out.choices[0].text
        step = calculator_step(text)
        if step.answer is not None:
            return float(str(step.answer) == record.ground_truth.strip())
        prompt += text + (step.observation or "")
    return 0.0
