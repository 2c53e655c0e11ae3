"""``AgentServer``: the OpenAI-compatible HTTP endpoint of one rollout worker.

    GET  /v1/models               the served model
    POST /v1/chat/completions     -> the episode's ChatEpisode.serve (stream=true: SSE)
    POST /v1/completions          -> the episode's ChatEpisode.serve (stream=true: SSE)
         Authorization: Bearer <the episode's key>   (any other key: 401)
    any other path or method      404 / 405

One server per worker, on the worker's event loop (its requests interleave with the
engine's other work; none blocks it), bound to the node's own address on a free port. Each
episode gets its own key, so the key is what routes a request to its episode's session; a
request without it is refused. Bodies are read as sent (a ``Content-Encoding`` is not
decoded) and bounded by what an episode can hold (``body_limit``: ``BYTES_PER_TOKEN`` per
token of the engine's context, at least ``MIN_BODY_BYTES``; 413 beyond). Every refusal,
aiohttp's own (404, 405) included, is an OpenAI error object (``{"error": {"message", "type",
"param", "code"}}``).

Whose failure it is (``ChatEpisode.serve`` draws the line): a request the endpoint cannot
serve is answered 4xx and the agent goes on; an engine failure inside a request is answered
500 and kept on the episode (``failure``), so the run sees the engine's error and not an
agent's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from recipe.agent.context import EpisodeCut
from recipe.agent.endpoint.bodies import RequestError
from recipe.agent.endpoint.chat import ChatEpisode, EngineFailure
from recipe.agent.endpoint.responses import stream_chunks

logger = logging.getLogger(__name__)

MODEL_NAME = "policy"
"""The model id ``/v1/models`` lists (requests may name any model: the policy answers)."""

BYTES_PER_TOKEN = 64
"""Body bytes allowed per token of context: JSON escapes (``\\u4e2d`` is 6 bytes of one
character), tool arguments escaped twice, message keys and token ids fit several times."""
MIN_BODY_BYTES = 2**20
"""The body limit of an engine with a small (or unknown) context."""


def body_limit(max_context: int | None) -> int:
    """The largest request body an episode on an engine of ``max_context`` tokens can send
    (None: unknown, the floor)."""
    return max(MIN_BODY_BYTES, BYTES_PER_TOKEN * (max_context or 0))


@dataclass(frozen=True, slots=True)
class Credentials:
    """What an agent needs to reach its episode."""

    base_url: str
    """``http://<node address>:<port>/v1`` (``http://[<address>]:<port>/v1`` for IPv6)."""
    api_key: str


@dataclass(slots=True)
class _Open:
    episode: ChatEpisode
    failure: BaseException | None = None


def node_address() -> str:
    """This node's address as Ray knows it (127.0.0.1 outside a Ray worker)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:  # pragma: no cover - Ray is a dependency
        pass
    return "127.0.0.1"


class AgentServer:
    """The endpoint (module docstring); ``start`` binds it, ``close`` releases it."""

    def __init__(self, host: str | None = None):
        self._host = host
        self._episodes: dict[str, _Open] = {}
        self._runner: Any = None
        self._starting: asyncio.Future[None] | None = None
        self.base_url = ""
        self.max_body_bytes = MIN_BODY_BYTES

    async def start(self, max_body_bytes: int = MIN_BODY_BYTES) -> None:
        """Bind the server, bodies over ``max_body_bytes`` refused (once: concurrent first
        calls wait for the one binding)."""
        if self._starting is None:
            self.max_body_bytes = max_body_bytes
            self._starting = asyncio.ensure_future(self._bind())
        await asyncio.shield(self._starting)

    async def _bind(self) -> None:
        from aiohttp import web

        app = web.Application(
            client_max_size=self.max_body_bytes, middlewares=[web.middleware(_openai_errors)]
        )
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._complete)
        # Bodies are read as sent: aiohttp's decoding of a Content-Encoding fails in its own
        # protocol code (a plain-text 400, or its 500 when the handler reads), never in ours.
        runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await runner.setup()
        host = self._host or node_address()
        # Every episode of a worker may connect at once: a short accept queue drops
        # connections the clients already count as open (they read ECONNRESET).
        site = web.TCPSite(runner, host, 0, backlog=4096)
        await site.start()
        port = runner.addresses[0][1]
        self._runner, self.base_url = runner, base_url(host, port)
        logger.info("agent endpoint serves at %s", self.base_url)

    def open(self, episode: ChatEpisode) -> Credentials:
        """Route a new key to ``episode``."""
        key = f"ep-{secrets.token_urlsafe(24)}"
        self._episodes[key] = _Open(episode)
        return Credentials(self.base_url, key)

    def failure(self, credentials: Credentials) -> BaseException | None:
        """The engine failure (or ``EpisodeCut``) a request of this episode met, if any."""
        held = self._episodes.get(credentials.api_key)
        return None if held is None else held.failure

    def close_episode(self, credentials: Credentials) -> None:
        """Refuse the key from now on and cancel the episode's requests in flight."""
        held = self._episodes.pop(credentials.api_key, None)
        if held is not None:
            held.episode.close()

    async def close(self) -> None:
        if self._starting is not None:
            starting, self._starting = self._starting, None
            with contextlib.suppress(Exception):
                await starting
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ---- handlers ------------------------------------------------------------------------

    async def _models(self, request: Any) -> Any:
        if self._held(request) is None:
            return _error(_unauthorized())
        model = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "recipe"}
        return _json({"object": "list", "data": [model]})

    async def _chat(self, request: Any) -> Any:
        return await self._serve(request, chat=True)

    async def _complete(self, request: Any) -> Any:
        return await self._serve(request, chat=False)

    async def _serve(self, request: Any, *, chat: bool) -> Any:
        held = self._held(request)
        if held is None:
            return _error(_unauthorized())
        body = await self._body(request)
        if isinstance(body, RequestError):
            held.episode.count_refused(body)
            return _error(body)
        try:
            result = await held.episode.serve(body, chat=chat)
        except RequestError as exc:
            return _error(exc)
        except EpisodeCut as exc:
            held.failure = exc
            return _error(RequestError(503, "the rollout worker stopped this episode"))
        except EngineFailure as exc:  # the engine's failure: the run must see it, not the agent
            held.failure = exc.error
            logger.warning("agent endpoint request failed in the engine: %r", exc.error)
            return _error(RequestError(500, f"the engine failed: {type(exc.error).__name__}"))
        if body.get("stream") is True:
            return await _stream(request, result)
        return _json(result)

    async def _body(self, request: Any) -> dict[str, Any] | RequestError:
        """The request's JSON object (any content type), or why it is refused."""
        from aiohttp import web

        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return RequestError(
                413,
                f"the request body is over {self.max_body_bytes} bytes, more than an episode "
                f"holds ({BYTES_PER_TOKEN} bytes per token of the engine's context)",
            )
        try:
            body = json.loads(raw)
        except Exception:  # ValueError, RecursionError (deep nesting), bad UTF-8
            encoding = request.headers.get("Content-Encoding", "identity")
            if encoding.lower() != "identity":
                return RequestError(
                    400,
                    f"the request body is not JSON (its Content-Encoding {encoding!r} is not "
                    "decoded: send the JSON as it is)",
                )
            return RequestError(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return RequestError(400, "the request body must be a JSON object")
        return body

    def _held(self, request: Any) -> _Open | None:
        auth = request.headers.get("Authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self._episodes.get(key.strip())


def base_url(host: str, port: int) -> str:
    """The ``/v1`` URL of ``host:port`` (an IPv6 address in brackets)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


async def _openai_errors(request: Any, handler: Any) -> Any:
    """aiohttp's own refusals (a path it does not serve, a method it does not allow) in the
    OpenAI error shape of every other answer, so an agent's client reads them as API errors."""
    from aiohttp import web

    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        served = "/v1/chat/completions, /v1/completions (POST) and /v1/models (GET)"
        message = f"{request.method} {request.path}: {exc.reason} (this endpoint serves {served})"
        response = _error(RequestError(exc.status, message))
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response


def _unauthorized() -> RequestError:
    return RequestError(401, "no episode has this API key", "invalid_api_key")


def _json(payload: dict[str, Any], status: int = 200) -> Any:
    from aiohttp import web

    return web.json_response(payload, status=status)


def _error(exc: RequestError) -> Any:
    return _json(exc.body(), exc.status)


async def _stream(request: Any, completion: dict[str, Any]) -> Any:
    from aiohttp import web

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in stream_chunks(completion):
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
