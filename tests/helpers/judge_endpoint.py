"""An OpenAI-compatible judge endpoint for tests: ``POST /v1/chat/completions`` answered by a
rule, so a run judged through ``reward.judge.base_url`` has verdicts a test can predict.

The rule reads prompts rendered from ``TEMPLATE`` (``reward.judge.template``): the response
that contains the ground truth wins ("Winner: A" / "Winner: B"), else a tie; a pointwise
prompt (no such fields) gets "Score: 5". The server runs
on its own thread and loop in the test's process and counts the requests it answered.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

TEMPLATE = "truth={ground_truth}\nA={response_a}\nB={response_b}\n"
"""A pairwise template the rule can read back (one field a line; responses are one line)."""
API_KEY = "judge-test-key"


@dataclass
class JudgeEndpoint:
    base_url: str = ""
    requests: int = 0
    bad_keys: int = 0
    models: set[str] = field(default_factory=set)


def verdict(content: str) -> str:
    """The rule's verdict on a prompt rendered from ``TEMPLATE``; "Score: 5" on a pointwise
    prompt (the built-in rubric a lone validation answer gets)."""
    if "\nA=" not in content:
        return "Score: 5"
    fields = dict(line.split("=", 1) for line in content.splitlines() if "=" in line)
    truth = fields.get("truth", "").strip()
    a, b = truth in fields.get("A", ""), truth in fields.get("B", "")
    return "Winner: A" if a and not b else "Winner: B" if b and not a else "Winner: tie"


@contextmanager
def judge_endpoint() -> Iterator[JudgeEndpoint]:
    """A running endpoint on 127.0.0.1 (a free port) until the block ends."""
    from aiohttp import web

    state = JudgeEndpoint()

    async def completions(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            state.bad_keys += 1
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        body = await request.json()
        state.requests += 1
        state.models.add(body["model"])
        text = verdict(body["messages"][-1]["content"])
        return web.json_response(
            {
                "id": f"judge-{state.requests}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
            }
        )

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state.base_url = f"http://127.0.0.1:{port}/v1"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
