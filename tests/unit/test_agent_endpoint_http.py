"""The agent endpoint's HTTP layer (recipe/agent/endpoint/server.py) on requests no OpenAI client
sends: paths and methods it does not serve, compressed bodies. Every refusal is answered
in the OpenAI error shape and, once it reached an episode, counted there; nothing is left to
aiohttp's own plain-text answers. A stand-in episode keeps what the server hands it."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import aiohttp

from recipe.agent.endpoint.server import AgentServer

USER = {"role": "user", "content": "What is 2 + 3?"}


class _Episode:
    """A ``ChatEpisode`` for requests that never reach one: it keeps what the server counts."""

    def __init__(self) -> None:
        self.refused: list[Any] = []

    def count_refused(self, error: Any) -> None:
        self.refused.append(error)

    def close(self) -> None:
        pass


def _answers(requests: list[tuple[str, str, bytes | None, dict[str, str]]]):
    """(status, JSON body or None, headers) of each request, with the episode's key
    written ``KEY`` in its headers; and the episode."""
    episode = _Episode()

    async def go():
        server = AgentServer("127.0.0.1")
        await server.start()
        key = server.open(episode).api_key
        answers = []
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True), auto_decompress=False
            ) as http:
                for method, path, data, headers in requests:
                    headers = {k: v.replace("KEY", key) for k, v in headers.items()}
                    async with http.request(
                        method, server.base_url + path, data=data, headers=headers, timeout=10
                    ) as response:
                        text = await response.text()
                        try:
                            body = json.loads(text)
                        except ValueError:
                            body = None
                        answers.append((response.status, body, response.headers))
        finally:
            await server.close()
        return answers

    return asyncio.run(go()), episode


def _error(body: Any) -> dict[str, Any]:
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    return body["error"]


def test_paths_and_methods_the_endpoint_does_not_serve_are_answered_as_openai_errors():
    auth = {"Authorization": "Bearer KEY"}
    chat = json.dumps({"messages": [USER]}).encode()
    answers, episode = _answers(
        [
            ("GET", "/chat/completions", None, auth),
            ("POST", "/embeddings", chat, auth),
            ("DELETE", "/models", None, {}),
        ]
    )
    assert [status for status, _, _ in answers] == [405, 404, 405]
    not_allowed, not_found, _ = (_error(body) for _, body, _ in answers)
    assert not_allowed["type"] == "invalid_request_error"
    assert not_allowed["message"].startswith("GET /v1/chat/completions: Method Not Allowed")
    assert answers[0][2]["Allow"] == "POST"
    assert not_found["message"].startswith("POST /v1/embeddings: Not Found")
    assert "/v1/chat/completions, /v1/completions (POST)" in not_found["message"]
    assert episode.refused == []  # no episode's request


def test_a_body_with_a_content_encoding_is_read_as_sent_and_refused_as_not_json():
    chat = json.dumps({"messages": [USER]}).encode()
    auth = {"Authorization": "Bearer KEY"}
    answers, episode = _answers(
        [
            ("POST", "/chat/completions", b"garbage", auth | {"Content-Encoding": "gzip"}),
            ("POST", "/completions", b"\x00", auth | {"Content-Encoding": "deflate"}),
            ("POST", "/chat/completions", gzip.compress(chat), auth | {"Content-Encoding": "gzip"}),
            ("POST", "/chat/completions", b"garbage", auth | {"Content-Encoding": "br"}),
        ]
    )
    # aiohttp's own answers before: a 500, a plain-text 400 "deflate", the body decoded, a
    # plain-text 400 (no brotli)
    assert [status for status, _, _ in answers] == [400, 400, 400, 400]
    for (_, body, _), encoding in zip(answers, ["gzip", "deflate", "gzip", "br"], strict=True):
        error = _error(body)
        assert error["message"] == (
            f"the request body is not JSON (its Content-Encoding '{encoding}' is not decoded: "
            "send the JSON as it is)"
        )
        assert error["type"] == "invalid_request_error"
    assert len(episode.refused) == 4  # counted on the episode
