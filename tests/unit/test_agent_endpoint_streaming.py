"""``stream=true`` on the agent endpoint (recipe/agent/endpoint) as an agent's `openai` client
reads it: ``/v1/completions`` streams ``text_completion`` chunks as ``/v1/chat/completions``
streams ``chat.completion.chunk`` ones, so a streaming agent reads the turn the policy is
trained on. Through the real server over a scripted engine (tests/helpers/agent_endpoint.py)."""

from __future__ import annotations

import textwrap

import pytest

from recipe.tiny import build_tokenizer
from tests.helpers.agent_endpoint import ScriptedEngine, make_endpoint, run_episode
from tests.helpers.chat_templates import TOOLS_TEMPLATE

pytestmark = pytest.mark.model  # builds a transformers tokenizer

STREAMING_AGENT = """
    async def run(client, record):
        stream = await client.completions.create(model="m", prompt="2 + 3 =", stream=True)
        chunks = [chunk async for chunk in stream]
        text = "".join(chunk.choices[0].text for chunk in chunks)
        assert text == " 5", chunks
        assert chunks[-1].choices[0].finish_reason == "stop", chunks
        assert chunks[-1].usage.completion_tokens == 3, chunks
        return 1.0
"""


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=4096)
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def test_a_streamed_text_completion_reaches_the_agent_as_chunks(tokenizer, tmp_path):
    agent = tmp_path / "streaming_agent.py"
    agent.write_text(textwrap.dedent(STREAMING_AGENT))
    engine = ScriptedEngine(tokenizer, [" 5"])
    episode = run_episode(make_endpoint(tokenizer, f"{agent}:run"), engine)
    # Before: a JSON body the client read as a stream of no chunks, the turn trained unseen.
    assert (episode.finish_reason, episode.reward) == ("stop", 1.0), episode.error
    tokens = episode.tokens
    model = [t for t, m in zip(tokens.response_ids, tokens.loss_mask, strict=True) if m]
    assert model == engine.sampled
