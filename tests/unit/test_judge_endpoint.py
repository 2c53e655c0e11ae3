"""``EndpointBackend`` (recipe/reward/judge/backend.py) against a real HTTP server on
127.0.0.1 that speaks the OpenAI chat-completions wire format: what the judge sends, the key
it sends it with, and how a failing or slow server ends (retried, then ``JudgeError``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from recipe.protocol import PromptRecord, Trajectory
from recipe.reward.judge import EndpointBackend, Judge, JudgeConfig, JudgeError
from recipe.reward.judge.judge import stable_seed

MODEL = "judge-7b"
KEY_ENV = "TEST_JUDGE_ENDPOINT_KEY"


class ChatServer:
    """A chat-completions server that answers every request with ``behaviour`` (``ok``,
    ``error`` or ``slow``) and keeps each request's JSON body and headers."""

    def __init__(self, behaviour: str = "ok", reply: str = "Sound.\nScore: 7") -> None:
        self.behaviour = behaviour
        self.reply = reply
        self.requests: list[tuple[dict[str, Any], dict[str, str]]] = []
        self._stop = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}/v1"

    async def close(self) -> None:
        self._stop.set()
        assert self._runner is not None
        await self._runner.cleanup()

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((body, dict(request.headers)))
        if self.behaviour == "error":
            return web.json_response(
                {"error": {"message": "engine crashed", "type": "server_error"}}, status=500
            )
        if self.behaviour == "slow":
            await self._stop.wait()
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.reply},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 41, "completion_tokens": 6, "total_tokens": 47},
            }
        )


def _run(server: ChatServer, cfg_kwargs: dict[str, Any], body: Callable[..., Awaitable[Any]]):
    """``body(judge)`` with a Judge over an EndpointBackend pointed at a started ``server``."""

    async def go() -> Any:
        await server.start()
        cfg = JudgeConfig(
            base_url=server.base_url, endpoint_model=MODEL, api_key_env=KEY_ENV, **cfg_kwargs
        )
        backend = EndpointBackend(cfg)
        try:
            return await body(Judge(cfg, backend, backoff_s=0.01))
        finally:
            await backend.close()
            await server.close()

    return asyncio.run(go())


def _group(uid: str = "train-12") -> tuple[PromptRecord, list[Trajectory]]:
    record = PromptRecord(uid=uid, prompt="What is 6*7?", ground_truth="42", data_source="qa")
    traj = Trajectory(
        prompt_uid=uid,
        sample_index=0,
        prompt_ids=[1],
        response_ids=[],
        rollout_logprobs=[],
        token_versions=[],
        finish_reason="stop",
        response_text="6*7 = {42}",
    )
    return record, [traj]


def test_the_request_carries_the_call_and_the_reply_is_scored(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    server = ChatServer()
    cfg = {"temperature": 0.6, "top_p": 0.9, "max_tokens": 77}

    async def body(judge: Judge) -> tuple[list[float], dict[str, float]]:
        return await judge.score_group(*_group()), judge.drain_metrics()

    scores, metrics = _run(server, cfg, body)
    assert scores == [0.7]
    [(request, headers)] = server.requests
    assert request["model"] == MODEL and request["max_tokens"] == 77
    assert request["temperature"] == 0.6 and request["top_p"] == 0.9
    assert request["seed"] == stable_seed("train-12", "0")
    [message] = request["messages"]
    assert message["role"] == "user" and "6*7 = {42}" in message["content"]
    assert "What is 6*7?" in message["content"] and "42" in message["content"]
    assert headers["Authorization"] == "Bearer sk-test-123"
    assert metrics["judge/prompt_tokens"] == 41 and metrics["judge/completion_tokens"] == 6


def test_an_unset_key_variable_sends_the_empty_key(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    server = ChatServer()

    async def body(judge: Judge) -> float:
        return await judge.score_one("q", "a", "a", uid="val-1")

    assert _run(server, {}, body) == 0.7
    assert server.requests[0][1]["Authorization"] == "Bearer EMPTY"


def test_a_server_error_is_retried_then_fails_naming_the_prompt():
    server = ChatServer("error")

    async def body(judge: Judge) -> dict[str, float]:
        with pytest.raises(JudgeError) as info:
            await judge.score_group(*_group("train-99"))
        message = str(info.value)
        assert "prompt train-99 (response 0)" in message and "2 attempts" in message
        assert "InternalServerError" in message and "engine crashed" in message
        return judge.drain_metrics()

    metrics = _run(server, {"retries": 1}, body)
    assert len(server.requests) == 2  # the client itself never retries; the Judge does, once
    assert metrics["judge/failures"] == 2 and metrics["judge/retries"] == 1


def test_a_slow_server_times_out_each_attempt():
    server = ChatServer()

    async def body(judge: Judge) -> float:
        assert await judge.score_one("q", "a", "a") == 0.7  # the client is made and connected
        server.behaviour = "slow"
        start = time.perf_counter()
        with pytest.raises(JudgeError, match=r"prompt train-12 \(response 0\) in 2 attempts"):
            await judge.score_group(*_group())
        return time.perf_counter() - start

    elapsed_s = _run(server, {"retries": 1, "timeout_s": 0.3}, body)
    assert len(server.requests) == 1 + 2
    assert 0.6 <= elapsed_s < 3.0  # two deadlines of 0.3 s, not the server's pace
