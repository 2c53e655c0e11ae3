"""reasoning-gym's procedural tasks as a prompt source (``data.source=reasoning_gym``).

    data.reasoning_gym.{dataset, config, seed, val_seed}, data.num_{train,val}_prompts
      --create_dataset(dataset, **config, seed=, size=)--> entries {question, answer, metadata}
      --> PromptRecord(uid="train:reasoning_gym/<dataset>:<i>",
                       prompt=[system prompt, question], ground_truth=answer,
                       data_source="reasoning_gym", extra_info={dataset, config, index, entry})

The sets are generated at startup, and again identically at a restart and in every process
(the fully async rollouter builds its own): entry i depends only on the task, its config, the
seed and i, so a uid (split, task, i) names the same prompt after a resume, as the exactly-once
prompt ledger needs. Some tasks also depend on Python's per-process hash seed (the order of a
set of strings), so the entries are generated under a pinned one, in a child process
(``recipe.data.reasoning_gym_entries``), which also reseeds the global ``random`` per entry.
A checkpoint records a fingerprint of the prompts (``recipe.data.fingerprint``): a resume with
another task config or reasoning-gym version is refused, not trained on other questions.
The entry travels in ``extra_info`` as reasoning-gym made it, for the scorer
(``recipe.reward.reasoning_gym``): it is plain data (JSON and pickle), but a JSON round trip
turns tuples into lists, which changes the scores of two tasks (``arc_agi``, ``rearc``), so
records are regenerated rather than stored. Most tasks generate thousands of entries a second;
a few take up to ~0.5 s an entry (``knight_swap``).

Train and validation. Nearly every task draws entry i of seed s from ``Random(s + i)``, so two
seeds closer than the set sizes give the same entries, shifted: the config refuses a
``val_seed`` whose range meets the train set's. Disjoint seeds still repeat questions when a
task's problem space is small (two one-digit terms), so each val entry whose question is
also a train question is dropped and the count logged as a warning; an empty val set is an
error. The train set keeps its repeats, as a file would (their count is logged).

The system prompt. Tasks are scored on the text inside ``<answer>`` tags, so the prompt must
ask for them: by default with reasoning-gym's own ``default`` system prompt, which keeps
rewards comparable with reasoning-gym's evaluations. Small instruct models often ignore a
system prompt or the tag format, and a response without the tag scores 0, so a group of such
responses teaches nothing: ``system_prompt=direct`` (short: answer only) and
``system_prompt_in_user`` (the instructions in the user turn, also for chat templates without
a system role) are the knobs for them.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from recipe.data.loaders import DataError
from recipe.data.reasoning_gym_entries import EntryJob, generate_entries
from recipe.protocol import ChatMessages, PromptRecord
from recipe.reward.reasoning_gym import DATA_SOURCE, import_reasoning_gym
from recipe.utils.config_check import ConfigError, require, require_non_negative

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "default"
"""The preset of ``reasoning_gym.utils.SYSTEM_PROMPTS`` used when none is configured."""
UNSUPPORTED = {"composite": "it mixes tasks given as objects; name one task per run"}
MAX_CLOSE_NAMES = 3
# Task config keys that other keys set, and which ones.
_SET_BY_OTHER_KEYS = {
    "seed": "data.reasoning_gym.seed and val_seed set it",
    "size": "data.num_train_prompts and num_val_prompts set it",
}


@dataclass
class ReasoningGymConfig:
    """One reasoning-gym task (``recipe.data.reasoning_gym``), used with
    ``data.source=reasoning_gym``; ``data.num_train_prompts`` / ``data.num_val_prompts`` size
    the two sets."""

    dataset: str = ""
    """reasoning-gym's name of the task (``chain_sum``, ``countdown``, ...); required."""
    config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task's config (``{min_terms: 2, max_terms: 3}``), except
    ``seed`` and ``size``, which the keys below and the set sizes give."""
    seed: int = 1
    """Seed of the train set: reasoning-gym draws entry i from ``Random(seed + i)``."""
    val_seed: int = 1_000_000_000
    """Seed of the validation set; entries ``val_seed + i`` must not overlap the train set's
    ``seed + i`` (far apart by default). Val questions also in the train set are dropped."""
    system_prompt: str | None = None
    """None: reasoning-gym's ``default`` system prompt (think, then ``<answer>...</answer>``);
    a preset name of ``reasoning_gym.utils.SYSTEM_PROMPTS`` (``direct``, ``simple``, ...); or
    the text itself. Empty: no system prompt (then nothing asks for the answer tags)."""
    system_prompt_in_user: bool = False
    """Put the system prompt at the top of the user message instead of a system message: for
    chat templates without a system role, and small models that follow the user turn better."""
    few_shot: int = 0
    """Worked examples before each question, as user/assistant turns whose answer is
    ``<answer>ANSWER</answer>``: small models copy the answer format from them (reasoning-gym
    scores only tagged answers). Drawn from the entries just before the val set's
    (``val_seed - few_shot + i``), the same for every prompt."""

    def __post_init__(self) -> None:
        require_non_negative("data.reasoning_gym.seed", self.seed)
        require_non_negative("data.reasoning_gym.val_seed", self.val_seed)
        require(0 <= self.few_shot <= 16, "data.reasoning_gym.few_shot", self.few_shot, "0..16")
        for key, set_by in _SET_BY_OTHER_KEYS.items():
            if key in self.config:
                raise ConfigError(
                    f"data.reasoning_gym.config.{key} is invalid: allowed unset ({set_by})"
                )


def check_reasoning_gym_config(cfg: ReasoningGymConfig, *, num_train: int, num_val: int) -> None:
    """``ConfigError`` naming the key for a missing or unknown task, a bad task config,
    overlapping seed ranges, a misspelt system prompt preset or a missing package."""
    require(
        bool(cfg.dataset),
        "data.reasoning_gym.dataset",
        cfg.dataset,
        "a reasoning-gym task name (e.g. chain_sum) with data.source=reasoning_gym",
    )
    try:
        import_reasoning_gym()
    except ImportError as err:
        raise ConfigError(f"data.source=reasoning_gym: {err}") from None
    config_cls = _config_class(cfg.dataset)
    _check_task_config(cfg, config_cls, num_train)
    _check_seed_ranges(cfg, num_train=num_train, num_val=num_val)
    system_prompt_text(cfg)


def _config_class(name: str) -> type:
    from reasoning_gym.factory import DATASETS

    if name in UNSUPPORTED:
        raise ConfigError(f"data.reasoning_gym.dataset={name!r} is invalid: {UNSUPPORTED[name]}")
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=MAX_CLOSE_NAMES, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. chain_sum, countdown"
        raise ConfigError(
            f"data.reasoning_gym.dataset={name!r} is invalid: not a reasoning-gym task; {hint} "
            f"({len(DATASETS)} tasks: reasoning_gym.factory.DATASETS)"
        )
    return DATASETS[name][1]


def _check_task_config(cfg: ReasoningGymConfig, config_cls: type, num_train: int) -> None:
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    unknown = sorted(set(cfg.config) - set(fields))
    if unknown:
        raise ConfigError(
            f"data.reasoning_gym.config.{unknown[0]} is invalid: {cfg.dataset} has no such "
            f"setting; allowed {', '.join(fields)}"
        )
    try:
        task_config = config_cls(**cfg.config, seed=cfg.seed, size=num_train)
        if callable(getattr(task_config, "validate", None)):
            task_config.validate()
    except (AssertionError, TypeError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            f"data.reasoning_gym.config={cfg.config!r} is invalid for {cfg.dataset}: {reason}"
        ) from None


def _check_seed_ranges(cfg: ReasoningGymConfig, *, num_train: int, num_val: int) -> None:
    # Entry i of seed s comes from Random(s + i): equal s + i means an equal entry. The
    # few-shot examples come just before the val range, so it is extended by them.
    low = cfg.val_seed - cfg.few_shot
    overlap = low < cfg.seed + num_train and cfg.seed < cfg.val_seed + num_val
    require(
        not overlap,
        "data.reasoning_gym.val_seed",
        cfg.val_seed,
        f"a seed whose entries val_seed + i (-few_shot={-cfg.few_shot} <= i < "
        f"data.num_val_prompts={num_val}) miss the train "
        f"set's seed + i (seed={cfg.seed}, i < data.num_train_prompts={num_train}); reasoning-"
        "gym draws entry i from Random(seed + i), so overlapping ranges share entries",
    )


def system_prompt_text(cfg: ReasoningGymConfig) -> str:
    """The system prompt of ``cfg``: a preset's text, the configured text, or "" for none."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    value = DEFAULT_SYSTEM_PROMPT if cfg.system_prompt is None else cfg.system_prompt
    if value in SYSTEM_PROMPTS:
        return SYSTEM_PROMPTS[value]
    # A single word is a misspelt preset, not a prompt: say so rather than send it to the model.
    if value and len(value.split()) == 1:
        raise ConfigError(
            f"data.reasoning_gym.system_prompt={value!r} is invalid: allowed a preset "
            f"({', '.join(SYSTEM_PROMPTS)}), a prompt of several words, or '' for none"
        )
    return value


def make_reasoning_gym_records(
    cfg: ReasoningGymConfig, *, split: str, num: int
) -> list[PromptRecord]:
    """The ``num`` entries of ``split`` (``train``: ``cfg.seed``, else ``cfg.val_seed``)."""
    return make_reasoning_gym_sets(cfg, {split: num})[split]


def make_reasoning_gym_sets(
    cfg: ReasoningGymConfig, sizes: dict[str, int]
) -> dict[str, list[PromptRecord]]:
    """The records of each set of ``sizes`` (split -> number of entries; ``train`` draws from
    ``cfg.seed``, any other from ``cfg.val_seed``), generated in one go under a pinned hash
    seed (``recipe.data.reasoning_gym_entries``), so a uid names the same prompt in every
    process."""
    system_prompt = system_prompt_text(cfg)
    jobs = [
        # Shared by a set's records (read-only): the arguments the scorer rebuilds the task from.
        EntryJob(cfg.dataset, {**cfg.config, "seed": _seed(cfg, split), "size": num}, split)
        for split, num in sizes.items()
    ]
    if cfg.few_shot:
        few_shot_args = {**cfg.config, "seed": cfg.val_seed - cfg.few_shot, "size": cfg.few_shot}
        jobs.append(EntryJob(cfg.dataset, few_shot_args, "few-shot"))
    start_s = time.monotonic()
    entries = generate_entries(jobs)
    examples = _few_shot_turns(cfg, entries[-1]) if cfg.few_shot else []
    sets: dict[str, list[PromptRecord]] = {}
    for job, split_entries in zip(jobs[: len(sizes)], entries, strict=False):  # few-shot: last
        sets[job.label] = [
            _record(cfg, job, index, entry, system_prompt, examples)
            for index, entry in enumerate(split_entries)
        ]
        logger.info(
            "generated %d %s prompts of reasoning-gym task %s (%d distinct questions)",
            len(split_entries),
            job.label,
            cfg.dataset,
            len({entry["question"] for entry in split_entries}),
        )
    logger.info("reasoning-gym generation took %.1f s", time.monotonic() - start_s)
    return sets


def _seed(cfg: ReasoningGymConfig, split: str) -> int:
    return cfg.seed if split == "train" else cfg.val_seed


def _record(
    cfg: ReasoningGymConfig,
    job: EntryJob,
    index: int,
    entry: dict[str, Any],
    system_prompt: str,
    examples: ChatMessages,
) -> PromptRecord:
    return PromptRecord(
        uid=f"{job.label}:{DATA_SOURCE}/{cfg.dataset}:{index}",
        prompt=_prompt(
            entry["question"], system_prompt, examples, in_user=cfg.system_prompt_in_user
        ),
        # A few tasks have no single answer (None): their scorer checks the response itself.
        ground_truth="" if entry.get("answer") is None else str(entry["answer"]),
        data_source=DATA_SOURCE,
        extra_info={
            "dataset": cfg.dataset,
            "config": job.task_args,
            "index": index,
            "entry": entry,
        },
    )


def _few_shot_turns(cfg: ReasoningGymConfig, entries: list[dict[str, Any]]) -> ChatMessages:
    """The ``few_shot`` worked examples as chat turns (user question, assistant answer)."""
    turns: ChatMessages = []
    for entry in entries:
        if entry.get("answer") is None:
            raise ConfigError(
                f"data.reasoning_gym.few_shot={cfg.few_shot} is invalid for {cfg.dataset}: its "
                "entries have no single answer to show; allowed 0"
            )
        turns += [
            {"role": "user", "content": entry["question"]},
            {"role": "assistant", "content": f"<answer>{entry['answer']}</answer>"},
        ]
    return turns


def _prompt(
    question: str, system_prompt: str, examples: ChatMessages, *, in_user: bool
) -> ChatMessages:
    turns = [*examples, {"role": "user", "content": question}]
    if not system_prompt:
        return turns
    if in_user:
        first = {"role": "user", "content": f"{system_prompt.rstrip()}\n\n{turns[0]['content']}"}
        return [first, *turns[1:]]
    return [{"role": "system", "content": system_prompt}, *turns]


def question_of(record: PromptRecord) -> str:
    """The task's question of a reasoning-gym record (what duplicates are judged on)."""
    return record.extra_info["entry"]["question"]


def drop_train_questions(val: list[PromptRecord], train: list[PromptRecord]) -> list[PromptRecord]:
    """``val`` without the records whose question is also a train question (warned, counted);
    ``DataError`` if none is left."""
    train_questions = {question_of(r) for r in train}
    kept = [r for r in val if question_of(r) not in train_questions]
    num_dropped = len(val) - len(kept)
    if num_dropped:
        logger.warning(
            "dropped %d of %d val prompts whose question is also in the train set "
            "(reasoning-gym task with a small problem space); %d val prompts remain",
            num_dropped,
            len(val),
            len(kept),
        )
    if not kept:
        raise DataError(
            f"every one of the {len(val)} val prompts is also a train prompt: the reasoning-gym "
            "task's problem space is too small for a held-out set; widen "
            "data.reasoning_gym.config or set data.val_files"
        )
    return kept
