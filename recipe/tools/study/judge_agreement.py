"""``python -m recipe.tools.study.judge_agreement responses=OUT/responses.jsonl [key=value ...]``:
how often the LLM judge (``reward.judge.*``) agrees with the rule scorer, on a held-out sample
of responses whose rule reward is known.

    responses.jsonl (``python -m recipe.tools.study.lengths``: uid, sample index, text, rule
    reward)  + the run's config (the same keys and presets as ``python -m recipe``)
      --RunInputs.load--> each response's prompt and ground truth, by uid
      --sample samples= (seeded)--> Judge.score_one on each, concurrently under the judge's
                          own concurrency bound, deadlines and retries
                          backend: reward.judge.base_url (EndpointBackend), or the judge
                          model on the run's rollout worker class, in this process
      --agreement.summarize--> table on stdout, OUT/agreement.json, OUT/judged.jsonl
                          (the judge engine's own output: OUT/engine.log)

Study keys (everything else is a config override; give the ones the responses were made with,
plus ``reward.judge.*``):

    responses=                      the responses file (required)
    samples=200                     responses judged (all of them when fewer)
    seed=0                          seed of the sample and of the kappa bootstrap
    threshold=0.5                   a judge score (in [0, 1]) at or above it passes
    out=outputs/study/judge_agreement  where agreement.json and judged.jsonl go

agreement.json holds the figures (recipe/tools/study/agreement.py says how each is computed),
the judge's ``judge/*`` metrics (parse failures, retries, failures, latency p50/p99 of its
calls) and the command's keys. A response the judge could not score is counted and listed
there and in judged.jsonl (its error), never scored 0. Bad input (a key, a file, a row, no
judge configured) prints one ``error:`` line and exits with code 2.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.config import RecipeConfig
from recipe.model import HFModelConfig, ModelConfig
from recipe.protocol import PromptRecord
from recipe.reward.judge import EndpointBackend, Judge, JudgeBackend, JudgeError
from recipe.run.inputs import RunInputs
from recipe.tools.cli import keys_and_overrides
from recipe.tools.study.agreement import JudgedResponse, format_table, summarize
from recipe.tools.study.judge_engine import EngineBackend
from recipe.tools.study.lengths import compose_config, write_outputs

logger = logging.getLogger(__name__)

STUDY_KEYS = {
    "responses": "",
    "samples": "200",
    "seed": "0",
    "threshold": "0.5",
    "out": "outputs/study/judge_agreement",
}
FIELDS = ("prompt_uid", "sample_index", "reward", "text")
"""What a row of the responses file must hold."""


@dataclass(frozen=True, slots=True)
class AgreementArgs:
    responses: Path
    num_samples: int
    seed: int
    threshold: float
    out: Path
    overrides: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Sampled:
    """A response to judge: its row of the responses file and its prompt's record."""

    row: int
    """Its line in the responses file, from 0."""
    sample_index: int
    rule_reward: float
    text: str
    record: PromptRecord


def parse(argv: list[str]) -> AgreementArgs:
    """Study keys and config overrides of ``argv``; ``ValueError`` naming a bad one."""
    args, overrides = keys_and_overrides(argv, __doc__, STUDY_KEYS)
    if not args["responses"]:
        raise ValueError("missing responses=: the responses.jsonl of study.lengths")
    try:
        samples, seed = int(args["samples"]), int(args["seed"])
    except ValueError:
        expected = f"samples={args['samples']!r}, seed={args['seed']!r}: expected integers"
        raise ValueError(expected) from None
    try:
        threshold = float(args["threshold"])
    except ValueError:
        threshold = float("nan")
    if samples < 1:
        raise ValueError(f"samples={samples}: expected an integer >= 1")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold={args['threshold']!r}: expected a number in [0, 1]")
    return AgreementArgs(
        Path(args["responses"]), samples, seed, threshold, Path(args["out"]), tuple(overrides)
    )


def read_responses(path: Path) -> list[dict[str, Any]]:
    """The rows of a responses file; ``ValueError`` naming a missing file or a bad row."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or type(err).__name__
        raise ValueError(f"responses={str(path)!r}: {why}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{path}:{number}: not a JSON object") from None
        missing = [f for f in FIELDS if not isinstance(row, dict) or f not in row]
        if missing:
            raise ValueError(
                f"{path}:{number}: no {', '.join(missing)} (a responses.jsonl of "
                "python -m recipe.tools.study.lengths holds them)"
            )
        if not _typed(row):
            raise ValueError(
                f"{path}:{number}: expected a numeric reward, an integer sample_index and a "
                "string text"
            )
        rows.append(row)
    if not rows:
        raise ValueError(f"responses={str(path)!r}: no responses")
    return rows


def _typed(row: dict[str, Any]) -> bool:
    number = isinstance(row["reward"], int | float) and not isinstance(row["reward"], bool)
    index = isinstance(row["sample_index"], int) and not isinstance(row["sample_index"], bool)
    return number and index and isinstance(row["text"], str)


def sample_responses(
    rows: list[dict[str, Any]], records: list[PromptRecord], num: int, seed: int
) -> list[Sampled]:
    """``num`` rows drawn without replacement (seeded; all when fewer), in file order, each
    with its record; ``ValueError`` for a row whose prompt the config's data lacks."""
    by_uid = {r.uid: r for r in records}
    picked = (
        range(len(rows)) if num >= len(rows) else random.Random(seed).sample(range(len(rows)), num)
    )
    sampled = []
    for row in sorted(picked):
        uid, truth = str(rows[row]["prompt_uid"]), rows[row].get("ground_truth")
        record = by_uid.get(uid)
        if record is None or (truth is not None and str(truth) != record.ground_truth):
            why = "no prompt" if record is None else "another ground truth for"
            raise ValueError(
                f"responses row {row + 1}: the config's data has {why} uid {uid!r} (give the "
                "data.* keys of the run that made the responses)"
            )
        text, reward = rows[row]["text"], rows[row]["reward"]
        sampled.append(Sampled(row, int(rows[row]["sample_index"]), float(reward), text, record))
    return sampled


def judge_model(cfg: RecipeConfig) -> HFModelConfig | None:
    """The judge model the tool starts (None with an endpoint); ``ValueError`` when no judge
    is configured or ``reward.judge.model`` is no usable model."""
    judge = cfg.reward.judge
    if not judge.enabled:
        raise ValueError("no judge: set reward.judge.model or reward.judge.base_url")
    if judge.model is None:
        return None
    from recipe.models.store import resolve_model_path

    path = str(resolve_model_path(judge.model))
    try:
        loaded = HFModelConfig.from_config(ModelConfig(path, dtype=cfg.model.dtype))
        loaded.tokenizer  # noqa: B018 - a folder without a usable tokenizer fails here
    except ValueError as err:  # the model checks name model.path: say which model it is
        why = str(err).removeprefix(f"model.path={path!r}: ")
        raise ValueError(f"reward.judge.model={judge.model!r}: {why}") from None
    return loaded


async def judge_all(judge: Judge, sampled: list[Sampled]) -> list[JudgedResponse]:
    """The judge's pointwise score (or error) of every sampled response, concurrently."""

    async def one(s: Sampled) -> JudgedResponse:
        uid = s.record.uid
        try:
            score = await judge.score_one(
                s.record.prompt, s.text, s.record.ground_truth, uid=f"{uid} (row {s.row + 1})"
            )
        except JudgeError as err:
            return JudgedResponse(uid, s.sample_index, s.rule_reward, None, str(err))
        return JudgedResponse(uid, s.sample_index, s.rule_reward, score)

    return list(await asyncio.gather(*(one(s) for s in sampled)))


async def run_judge(
    cfg: RecipeConfig, model: HFModelConfig | None, sampled: list[Sampled], engine_log: Path
) -> tuple[list[JudgedResponse], dict[str, float]]:
    """Judge ``sampled`` with the configured backend; (verdicts, ``judge/*`` metrics)."""
    judge_cfg = cfg.reward.judge
    backend: JudgeBackend
    close: Callable[[], Awaitable[None]]
    if model is None:
        endpoint = EndpointBackend(judge_cfg)
        backend, close = endpoint, endpoint.close
    else:
        engine = EngineBackend.start(cfg, model, engine_log)
        backend, close = engine, engine.shutdown
    try:
        judge = Judge(judge_cfg, backend)
        return await judge_all(judge, sampled), judge.drain_metrics()
    finally:
        await close()


def measure(
    args: AgreementArgs, cfg: RecipeConfig, model: HFModelConfig | None, sampled: list[Sampled]
) -> dict[str, Any]:
    """Judge, summarise; print the table and write ``args.out``'s files."""
    args.out.mkdir(parents=True, exist_ok=True)
    judged, metrics = asyncio.run(run_judge(cfg, model, sampled, args.out / "engine.log"))
    summary = summarize(judged, args.threshold, seed=args.seed)
    judge = cfg.reward.judge
    report = {
        "responses": str(args.responses),
        "samples": args.num_samples,
        "seed": args.seed,
        "threshold": args.threshold,
        "overrides": list(args.overrides),
        "judge": {"model": judge.model, "base_url": judge.base_url, "mode": judge.mode},
        **summary,
        "judge_metrics": metrics,
    }
    print(format_table(report), flush=True)
    write_outputs(args.out, report, judged, ("agreement.json", "judged.jsonl"))
    print(f"wrote {args.out / 'agreement.json'} and {args.out / 'judged.jsonl'}")
    return report


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    try:  # bad input (a key, a file, a row, a model path, no judge): one line, exit code 2
        args = parse(argv)
        rows = read_responses(args.responses)
        cfg = compose_config(args.overrides)
        model = judge_model(cfg)
        inputs = RunInputs.load(cfg)
        sampled = sample_responses(rows, inputs.train_records + inputs.val_records,
                                   args.num_samples, args.seed)  # fmt: skip
    except ValueError as err:
        if os.environ.get("RECIPE_DEBUG", "0") not in ("", "0"):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    measure(args, cfg, model, sampled)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
