"""What the endpoint fuzz tier (tests/helpers/endpoint_fuzz.py) checks, and the engine it runs
on: ``FuzzEngine`` samples the text or token ids a case drew, as vLLM would (stops at EOS,
cut to the turn's budget, optionally aborted once by a weight sync, optionally failing), and
keeps what it was asked and what it sampled, so ``check_tokens`` can hold the episode's
recorded tokens against it.

    check_answer   200 in the OpenAI shape of its path (chat.completion, text_completion,
                   their SSE chunks under stream=true, the model list); 4xx with
                   {"error": {"message", "type"}}; 5xx only when the engine itself failed
                   (500; 503: the worker stopped)
    check_turn     a 200 shows the turn the engine sampled: usage, finish reason, text
    check_tokens   every recorded model token is one the engine sampled, in order, with its
                   log-prob and version; lengths agree; each turn follows its context
    LogCapture     no exception escaped to aiohttp or the loop; no endpoint warning unless
                   the engine failed
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

from recipe.agent.context import EpisodeCut, TurnOutput
from recipe.agent.endpoint.chat import ChatEpisode
from recipe.agent.episode import ENV_VERSION

DEFAULT_REPLY = "OK."
"""What the engine samples once a case's drawn outputs are used up."""
FINISH = {
    "chat.completion": {"stop", "length", "tool_calls"},
    "text_completion": {"stop", "length"},
}


@dataclass(slots=True)
class Call:
    """One ``generate_turn`` call: its context and budget, and what it returned."""

    turn: int
    context: list[int]
    max_tokens: int
    output: TurnOutput | None = None
    """None: the call raised."""


class FuzzEngine:
    """A ``TurnEngine`` that samples ``outputs`` (text or token ids) in order, one per turn,
    then ``DEFAULT_REPLY``. Each stops at its first EOS (one is appended when it has none) and
    is cut to the turn's budget (``length``). ``cut_at``: the first turn longer than that is
    aborted there, as a weight sync does (the version goes up; the next call continues it).
    ``fail``: raised by every generate call after the first ``fail_after`` calls, or
    (``fail_in_wait``) by the wait for the engine after a cut."""

    def __init__(
        self,
        tokenizer: Any,
        outputs: list[str | list[int]] = (),  # type: ignore[assignment]
        *,
        cut_at: int | None = None,
        fail: Exception | None = None,
        fail_after: int = 0,
        fail_in_wait: bool = False,
    ):
        self.tokenizer, self.eos_id = tokenizer, tokenizer.eos_token_id
        self.outputs = list(outputs)
        self.cut_at, self.fail, self.fail_after = cut_at, fail, fail_after
        self.fail_in_wait = fail_in_wait
        self.version = 0
        self.calls: list[Call] = []
        self.num_turns = 0
        self.failed_turns: set[int] = set()
        """Turns that raised: none of their tokens may be recorded."""
        self.error: Exception | None = None
        """What the engine raised last (what the run must be given)."""
        self._pending: list[int] = []
        self._in_turn = False  # the last call was aborted: the next one continues its turn
        self._num_tokens = 0

    @property
    def num_failed(self) -> int:
        return len(self.failed_turns)

    async def generate_turn(self, context_ids: list[int], max_tokens: int, seed: Any) -> TurnOutput:
        if not self._in_turn:
            self.num_turns += 1
        call = Call(self.num_turns - 1, list(context_ids), max_tokens)
        self.calls.append(call)
        if self.fail is not None and not self.fail_in_wait and len(self.calls) > self.fail_after:
            self._raise()
        await asyncio.sleep(0)  # a real engine yields: requests of other episodes interleave
        if not self._in_turn:
            self._pending = self._next_output()
        take = min(max_tokens, len(self._pending))
        finish = "stop" if take == len(self._pending) else "length"
        if self.cut_at is not None and 0 < self.cut_at < take:
            take, finish, self.cut_at = self.cut_at, "aborted", None
        ids, self._pending = self._pending[:take], self._pending[take:]
        logprobs = [-(self._num_tokens + i + 1) / 1024 for i in range(take)]
        self._num_tokens += take
        call.output = TurnOutput(ids, logprobs, [self.version] * take, finish, num_cached_tokens=0)
        self._in_turn = finish == "aborted"
        if self._in_turn:
            self.version += 1
        return call.output

    async def wait_until_running(self) -> None:
        if self.fail is not None and self.fail_in_wait:
            self._raise()

    def _raise(self) -> NoReturn:
        assert self.fail is not None
        self.failed_turns.add(self.num_turns - 1)
        self.error, self._in_turn = self.fail, False
        raise self.fail

    def _next_output(self) -> list[int]:
        drawn = self.outputs.pop(0) if self.outputs else DEFAULT_REPLY
        if isinstance(drawn, str):  # what a model samples is valid text: no lone surrogate
            valid = drawn.encode("utf-8", errors="replace").decode("utf-8")
            drawn = list(self.tokenizer.encode(valid, add_special_tokens=False))
        if self.eos_id in drawn:
            return drawn[: drawn.index(self.eos_id) + 1]
        return [*drawn, self.eos_id]


# ---- answers ---------------------------------------------------------------------------------


def check_answer(
    answer: Any, path: str, body: Any, *, engine_error: Exception | None, head: bool = False
) -> None:
    """``answer`` keeps the endpoint's answer property (module docstring); ``engine_error``:
    what the engine raised while it was served."""
    status, where = answer.status, f"{path}: {answer.status} {answer.text[:300]!r}"
    path = urlsplit(path).path
    if engine_error is not None:  # a worker stopping (EpisodeCut) is 503, any other 500
        expected = 503 if isinstance(engine_error, EpisodeCut) else 500
        assert status == expected, f"the engine raised {engine_error!r} but the answer is {where}"
    elif status >= 500:
        raise AssertionError(f"a server error without an engine failure: {where}")
    assert status == 200 or 400 <= status < 600, where
    if head:  # no body by HTTP
        return
    if status >= 400:
        error = answer.body.get("error") if isinstance(answer.body, dict) else None
        assert isinstance(error, dict), f"not an OpenAI error body: {where}"
        assert isinstance(error.get("message"), str) and error["message"], where
        assert isinstance(error.get("type"), str), where
        return
    kind = {"/chat/completions": "chat.completion", "/completions": "text_completion"}
    if path in kind and isinstance(body, dict) and body.get("stream") is True:
        assert answer.content_type == "text/event-stream", where
        _check_chunks(answer.body, kind[path], where)
    elif path in kind:
        _check_completion(answer.body, kind[path], where)
    else:
        assert isinstance(answer.body, dict) and answer.body.get("object") == "list", where


def _check_completion(body: Any, kind: str, where: str) -> None:
    assert isinstance(body, dict) and body.get("object") == kind, where
    assert isinstance(body.get("id"), str) and isinstance(body.get("model"), str), where
    choices = body.get("choices")
    assert isinstance(choices, list) and len(choices) == 1, where
    choice = choices[0]
    assert choice.get("finish_reason") in FINISH[kind], where
    usage = body.get("usage")
    assert isinstance(usage, dict), where
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], where
    assert usage["completion_tokens"] >= 1 and usage["prompt_tokens"] >= 1, where
    if kind == "text_completion":
        assert isinstance(choice.get("text"), str), where
        return
    message = choice.get("message")
    assert isinstance(message, dict) and message.get("role") == "assistant", where
    assert message.get("content") is None or isinstance(message["content"], str), where
    calls = message.get("tool_calls")
    assert (calls is not None) == (choice["finish_reason"] == "tool_calls"), where
    for call in calls or []:
        _check_call(call, where)


def _check_call(call: Any, where: str) -> None:
    assert isinstance(call, dict) and isinstance(call.get("id"), str), where
    assert call.get("type") == "function", where
    function = call.get("function")
    assert isinstance(function, dict) and isinstance(function.get("name"), str), where
    assert function["name"], where
    assert isinstance(function.get("arguments"), str), where
    assert isinstance(json.loads(function["arguments"]), dict), where


def _check_chunks(events: Any, kind: str, where: str) -> None:
    assert isinstance(events, list) and len(events) >= 2 and events[-1] == "[DONE]", where
    chunks = events[:-1]
    chunk_kind = "chat.completion.chunk" if kind == "chat.completion" else kind
    for chunk in chunks:
        assert isinstance(chunk, dict) and chunk.get("object") == chunk_kind, where
    assert chunks[-1]["choices"][0]["finish_reason"] in FINISH[kind], where
    assert isinstance(chunks[-1].get("usage"), dict), where
    if kind == "text_completion":
        assert all(isinstance(c["choices"][0]["text"], str) for c in chunks), where
        return
    first = chunks[0]["choices"][0]["delta"]
    assert first.get("role") == "assistant", where
    for call in first.get("tool_calls") or []:
        _check_call({k: v for k, v in call.items() if k != "index"}, where)


def check_turn(answer: Any, body: Any, calls: list[Call], chat: ChatEpisode) -> None:
    """A 200 answer against the turn the engine sampled for it (``calls``): ``usage`` counts
    its context and tokens, the finish reason is how it ended, and, without tools, the text
    is its tokens decoded (the stop token and special tokens left out)."""
    where = answer.text[:300]
    assert calls and all(c.output is not None for c in calls), where
    ids = [t for c in calls for t in c.output.ids]  # type: ignore[union-attr]
    events = isinstance(answer.body, list)
    final = answer.body[-2] if events else answer.body
    usage = final["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(calls[0].context), len(ids))
    first = answer.body[0]["choices"][0] if events else answer.body["choices"][0]
    message = first.get("delta") if events else first.get("message")
    finish = final["choices"][0]["finish_reason"]
    stopped = chat.session.renderer.is_eos(ids[-1])
    if message is None:  # a text completion
        assert finish == ("stop" if stopped else "length"), where
        text = first["text"]
    elif message.get("tool_calls"):
        return
    else:
        assert finish == ("stop" if stopped else "length"), where
        if isinstance(body, dict) and body.get("tools"):  # a parser's content: not the text
            return
        text = message["content"]
    shown = ids[:-1] if stopped else ids
    assert text == chat.session.renderer.tokenizer.decode(shown, skip_special_tokens=True), where


# ---- the episode's tokens ----------------------------------------------------------------------


def snapshot(chat: ChatEpisode) -> tuple[Any, ...]:
    """What a refused request must leave as it was: every segment's tokens and history."""
    segments = tuple(
        (
            tuple(s.tokens.prompt_ids),
            tuple(s.tokens.response_ids),
            tuple(s.tokens.loss_mask),
            len(s.messages),
            s.text,
            id(s.tools),
            tuple(s.last_turn_ids),
        )
        for s in chat.session.segments
    )
    return (segments, chat.num_turns)


def check_tokens(chat: ChatEpisode, engine: FuzzEngine) -> None:
    """The episode's recorded tokens against what the engine sampled (module docstring)."""
    limits = chat.limits
    vocab = len(engine.tokenizer)
    kept = [c for c in engine.calls if c.turn not in engine.failed_turns]
    recorded: tuple[list[int], list[float], list[int]] = ([], [], [])
    for s in chat.session.segments:
        t = s.tokens
        lengths = (len(t.response_ids), len(t.loss_mask), len(t.logprobs), len(t.versions))
        assert len(set(lengths)) == 1, f"response/mask/log-prob/version lengths {lengths}"
        assert t.num_response_tokens <= limits.response_length, t.num_response_tokens
        if limits.max_context is not None:
            assert len(t.context_ids) <= limits.max_context, len(t.context_ids)
        assert all(0 <= i < vocab for i in t.context_ids), "a token id outside the vocabulary"
        for i, mask in enumerate(t.loss_mask):
            if mask == 1:
                recorded[0].append(t.response_ids[i])
                recorded[1].append(t.logprobs[i])
                recorded[2].append(t.versions[i])
            else:
                assert mask == 0 and t.logprobs[i] == 0.0 and t.versions[i] == ENV_VERSION
    sampled: tuple[list[int], list[float], list[int]] = ([], [], [])
    for call in kept:
        assert call.output is not None
        sampled[0].extend(call.output.ids)
        sampled[1].extend(call.output.logprobs)
        sampled[2].extend(call.output.versions)
    assert recorded[0] == sampled[0], "the recorded model tokens are not the engine's, in order"
    assert recorded[1] == sampled[1], "the recorded log-probs are not the engine's"
    assert recorded[2] == sampled[2], "the recorded versions are not the engine's"
    for call in engine.calls:
        assert call.max_tokens >= 1, f"the engine was asked for {call.max_tokens} tokens"
        if limits.max_context is not None:
            assert len(call.context) + call.max_tokens <= limits.max_context
    for call in kept:
        assert _follows(chat, call), "a sampled turn is not recorded after its context"


def _follows(chat: ChatEpisode, call: Call) -> bool:
    assert call.output is not None
    n, ids = len(call.context), call.output.ids
    return any(
        s.tokens.context_ids[:n] == call.context and s.tokens.context_ids[n : n + len(ids)] == ids
        for s in chat.session.segments
    )


# ---- logs ----------------------------------------------------------------------------------------


WATCHED_LOGS = {"aiohttp": logging.ERROR, "asyncio": logging.ERROR, "recipe.agent": logging.WARNING}


class LogCapture(logging.Handler):
    """Exceptions that escaped to aiohttp or the event loop, and the endpoint's warnings."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.loop_errors: list[str] = []
        self._levels: dict[str, int] = {}
        for name in WATCHED_LOGS:
            log = logging.getLogger(name)
            self._levels[name] = log.level
            if log.getEffectiveLevel() > logging.WARNING:
                log.setLevel(logging.WARNING)
            log.addHandler(self)
        loop.set_exception_handler(lambda _, context: self.loop_errors.append(str(context)))

    def emit(self, record: logging.LogRecord) -> None:
        for name, level in WATCHED_LOGS.items():
            if record.name.startswith(name) and record.levelno >= level:
                self.records.append(record)

    def clear(self) -> None:
        self.records.clear()
        self.loop_errors.clear()

    def check(self, *, engine_failed: bool) -> None:
        assert not self.loop_errors, f"unhandled on the event loop: {self.loop_errors}"
        for record in self.records:
            if engine_failed and record.name.startswith("recipe.agent"):
                continue
            raise AssertionError(
                f"logged by {record.name}: {record.getMessage()} {record.exc_info}"
            )

    def close(self) -> None:
        for name, level in self._levels.items():
            log = logging.getLogger(name)
            log.removeHandler(self)
            log.setLevel(level)
