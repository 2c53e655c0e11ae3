"""``Judge``: scores a group's responses with an LLM judge, for tasks without a verifier.

    score_group(record, trajs)
      pointwise: one call per response -----------+
      pairwise:  one call per pair i<j, A/B order  +--> _verdict, per call:
                 alternating with the pair index --+      semaphore (max_concurrency)
                                                          wait_for(complete, timeout_s)
                                                          parse; retry <= retries times
      -> one score in [0, 1] per response    <---------  verdict | JudgeError

Pointwise: the judge's ``Score: N`` normalised to [0, 1]. Pairwise: response i's score is
(wins + 0.5 * ties) / (n - 1). Pair p (in ``itertools.combinations`` order) shows its lower
index as A when p is even, its higher one when p is odd: for odd n every response is shown
first in exactly half its pairs, so a judge that always picks A gives every response 0.5; for
even n the count is (n - 1) / 2 rounded up or down, a bias of at most 1 / (2 (n - 1)).
``both_orders`` asks each pair in both orders, each verdict worth half: no position bias for
any n, at twice the calls.

A call fails when it raises, passes ``timeout_s`` or gives no readable verdict; it is tried
again up to ``retries`` times (after 0.5 s * attempt), and then the group fails with a
``JudgeError``: a response the judge could not score is never a silent 0. Seeds come from
(prompt uid, response, attempt) through a stable hash, so a rerun asks the same questions
with the same seeds; with temperature > 0 a retry samples anew. A greedy judge (temperature
0) would repeat an unreadable reply word for word: its retry after one samples at
``retry_temperature``. Where the backend constrains decoding (the run's own engines) and the
verdicts can be listed (``prompts.correction``: whole scores of a whole scale, the pairwise
winners), that retry is a follow-up turn instead: the request, the judge's reply, and a
correction restating the verdict's form and scale, the reply constrained to the verdicts.
Elsewhere the question is asked again as it was: on the CPU, a 0.5B judge told its scale
without the constraint repeated its out-of-scale score for 3 of 5 responses, where asked
again it did so for none (on a GPU, asked again, once in each of two runs of about 400
calls, which stopped one of them). A retry after an error
or a deadline repeats the last request as it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from recipe.protocol import ChatMessages, PromptRecord, Trajectory
from recipe.reward.judge.backend import JudgeBackend, JudgeCall, JudgeReply
from recipe.reward.judge.config import JudgeConfig
from recipe.reward.judge.metrics import JudgeStats
from recipe.reward.judge.prompts import (
    Correction,
    builtin_template,
    correction,
    render_pairwise,
    render_pointwise,
)
from recipe.reward.judge.verdicts import parse_score, parse_winner

logger = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.5
"""Wait before attempt k (k >= 1) is this times k."""
SEED_RANGE = 2**31 - 2**16
"""Seeds lie below 2**31 (what every server takes), leaving room for + attempt."""

V = TypeVar("V")


class JudgeError(RuntimeError):
    """The judge could not score a response: every attempt raised, timed out or gave no
    readable verdict. Names the prompt uid, the response index, the attempts and the
    judge's last reply or error."""


def stable_seed(uid: str, key: str) -> int:
    """A seed from a prompt uid and a response key, the same in every process and run
    (Python's ``hash`` of a string is salted per process)."""
    digest = hashlib.blake2b(f"{uid}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SEED_RANGE


async def gather_or_cancel(coros: Iterable[Awaitable[V]]) -> list[V]:
    """All results in order; on the first exception the others are cancelled (no judge
    calls left running for a group that already failed) and it is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class Judge:
    """Scores responses with an LLM judge through ``backend`` (module docstring)."""

    def __init__(
        self, cfg: JudgeConfig, backend: JudgeBackend, *, backoff_s: float = RETRY_BACKOFF_S
    ) -> None:
        """``backoff_s``: the wait before retry k is ``backoff_s * k``."""
        self.cfg = cfg
        self.backend = backend
        self.backoff_s = backoff_s
        self._template = cfg.template_text
        self._stats = JudgeStats()
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def score_group(self, record: PromptRecord, trajs: list[Trajectory]) -> list[float]:
        """One score in [0, 1] per trajectory, in order; ``JudgeError`` if any fails."""
        if self.cfg.mode == "pairwise":
            return await self._score_pairs(record, trajs)
        return await gather_or_cancel(
            self._score_response(
                record.prompt,
                t.response_text,
                record.ground_truth,
                record.uid,
                key=str(t.sample_index),
                what=f"response {t.sample_index}",
            )
            for t in trajs
        )

    async def score_one(
        self,
        prompt: str | ChatMessages,
        response: str,
        ground_truth: str,
        *,
        uid: str = "?",
    ) -> float:
        """One response's pointwise score in [0, 1] (whatever ``mode`` is), for a reward
        function that combines a rule with the judge; ``JudgeError`` if it fails."""
        key = hashlib.blake2b(response.encode(), digest_size=8).hexdigest()
        return await self._score_response(
            prompt, response, ground_truth, uid, key=key, what="a response"
        )

    def drain_metrics(self) -> dict[str, float]:
        """``judge/*`` metrics since the last drain (empty when no call was made)."""
        depth = self._stats.queue_depth  # calls still waiting stay counted
        stats, self._stats = self._stats, JudgeStats(queue_depth=depth, queue_depth_max=depth)
        return stats.metrics()

    async def _score_response(
        self,
        prompt: str | ChatMessages,
        response: str,
        ground_truth: str,
        uid: str,
        *,
        key: str,
        what: str,
    ) -> float:
        cfg = self.cfg
        template = self._template if cfg.mode == "pointwise" else builtin_template("pointwise")
        text = render_pointwise(
            template, prompt, response, ground_truth, cfg.score_min, cfg.score_max
        )
        fix = correction("pointwise", cfg.score_min, cfg.score_max)
        return await self._verdict(
            text,
            uid,
            key,
            what,
            lambda reply: parse_score(reply, cfg.score_min, cfg.score_max),
            fix,
        )

    async def _score_pairs(self, record: PromptRecord, trajs: list[Trajectory]) -> list[float]:
        n = len(trajs)
        if n == 1:
            raise JudgeError(
                f"reward.judge.mode=pairwise needs rollout.n >= 2: prompt {record.uid} has one "
                "response"
            )
        pairs = list(itertools.combinations(range(n), 2))
        if self.cfg.both_orders:  # each pair once in each order, each verdict worth half
            shown = [*pairs, *((j, i) for i, j in pairs)]
        else:
            shown = [(i, j) if p % 2 == 0 else (j, i) for p, (i, j) in enumerate(pairs)]
        winners = await gather_or_cancel(self._compare(record, trajs, a, b) for a, b in shown)
        weight = 0.5 if self.cfg.both_orders else 1.0
        points = [0.0] * n
        for (a, b), winner in zip(shown, winners, strict=True):
            if winner == "tie":
                points[a] += 0.5 * weight
                points[b] += 0.5 * weight
            else:
                points[a if winner == "A" else b] += weight
        return [p / (n - 1) for p in points]

    async def _compare(self, record: PromptRecord, trajs: list[Trajectory], a: int, b: int) -> str:
        """The verdict on responses ``a`` (shown as A) and ``b`` (shown as B)."""
        cfg = self.cfg
        text = render_pairwise(
            self._template,
            record.prompt,
            trajs[a].response_text,
            trajs[b].response_text,
            record.ground_truth,
            cfg.score_min,
            cfg.score_max,
        )
        ia, ib = trajs[a].sample_index, trajs[b].sample_index
        what = f"responses {ia} (A) and {ib} (B)"
        fix = correction("pairwise", cfg.score_min, cfg.score_max)
        return await self._verdict(text, record.uid, f"{ia}:{ib}", what, parse_winner, fix)

    async def _verdict(
        self,
        text: str,
        uid: str,
        key: str,
        what: str,
        parse: Callable[[str], V | None],
        fix: Correction,
    ) -> V:
        """Ask the judge about ``text`` until ``parse`` reads its reply, at most
        1 + ``retries`` times, following an unreadable reply up with ``fix``; ``JudgeError``
        naming ``uid`` and ``what`` after that."""
        cfg = self.cfg
        base_seed = stable_seed(uid, key)
        last, temperature = "", cfg.temperature
        messages = [{"role": "user", "content": text}]
        choices: tuple[str, ...] | None = None
        for attempt in range(cfg.retries + 1):
            if attempt:
                self._stats.retries += 1
                logger.warning("judge on prompt %s (%s): %s; retrying", uid, what, last)
                await asyncio.sleep(self.backoff_s * attempt)
            call = JudgeCall(
                messages=messages,
                temperature=temperature,
                top_p=cfg.top_p,
                max_tokens=cfg.max_tokens,
                seed=base_seed + attempt if temperature > 0 else base_seed,
                choices=choices,
            )
            reply = await self._attempt(call)
            if isinstance(reply, str):
                last = reply
                continue
            verdict = parse(reply.text)
            if verdict is not None:
                return verdict
            self._stats.parse_failures += 1
            last = f"no verdict in its reply {reply.text[-300:]!r}"
            temperature = cfg.temperature or cfg.retry_temperature
            if fix.choices is not None and self.backend.constrains:
                messages = [
                    {"role": "user", "content": text},
                    {"role": "assistant", "content": reply.text},
                    {"role": "user", "content": fix.text},
                ]
                choices = fix.choices
        raise JudgeError(
            f"the judge could not score prompt {uid} ({what}) in {cfg.retries + 1} attempts; "
            f"last: {last}"
        )

    async def _attempt(self, call: JudgeCall) -> JudgeReply | str:
        """One call under the concurrency bound and the deadline: its reply, or what went
        wrong when it raised or timed out."""
        semaphore = self._semaphore_on_this_loop()
        if semaphore.locked():
            self._stats.waiting(+1)
            try:
                await semaphore.acquire()
            finally:
                self._stats.waiting(-1)
        else:
            await semaphore.acquire()
        start = time.perf_counter()
        try:
            reply = await asyncio.wait_for(self.backend.complete(call), self.cfg.timeout_s)
        except TimeoutError:
            error = f"no reply within reward.judge.timeout_s={self.cfg.timeout_s}"
        except Exception as err:
            lines = [line for line in str(err).splitlines() if line.strip()]
            error = f"{type(err).__name__}: {lines[0][:300] if lines else '(no message)'}"
        else:
            error = ""
        finally:
            semaphore.release()
        self._stats.latencies_s.append(time.perf_counter() - start)
        if error:
            self._stats.failures += 1
            return error
        self._stats.prompt_tokens += reply.prompt_tokens
        self._stats.completion_tokens += reply.completion_tokens
        return reply

    def _semaphore_on_this_loop(self) -> asyncio.Semaphore:
        # An asyncio.Semaphore belongs to the loop it first waits on: one per loop.
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._loop is not loop:
            self._semaphore = asyncio.Semaphore(self.cfg.max_concurrency)
            self._loop = loop
        return self._semaphore
