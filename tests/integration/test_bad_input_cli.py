"""Bad input to ``python -m recipe`` fails at startup: exit code 2 within seconds, one line on
stderr naming the key, file or row, and no traceback (``RECIPE_DEBUG=1`` shows it).

Every case runs the real command line (``recipe.main.cli``, what ``python -m recipe`` runs):
all of them one after another in one interpreter (tests/helpers/cli_batch.py, which pays the
imports once), and one case per checking stage in a subprocess of its own, where the process's
exit code and stderr are the contract. Every check fires before Ray starts
(override keys and types before Hydra composes, config values in ``load_config``, the run
directory in a Hydra callback, data, reward function and model in the recipe's constructor
before ``ray.init``), which the time bounds
guard: CPU seconds of the command (what it did; a busy CI machine does not inflate them) and
a looser wall-clock bound (that it did not hang). The model cases pay for importing
transformers (~10 CPU seconds on a slow CPU). The per-field rules themselves are unit-tested
next to their components (tests/unit/test_config.py, test_data_loaders.py,
test_model_config.py, test_overrides.py, test_reward.py).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import agent_envs, cli_batch

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CPU_BOUND_S = 20.0
"""Startup failures cost seconds of imports; starting Ray and an engine costs far more."""
WALL_BOUND_S = 60.0

ROW = {
    "data_source": "arithmetic",
    "prompt": [{"role": "user", "content": "1+1="}],
    "reward_model": {"style": "rule", "ground_truth": "2"},
}


def _run(
    run_dir: Path, *overrides: str, debug: bool = False, env_extra: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, tuple[float, float]]:
    env = {**os.environ, "RECIPE_DEBUG": "1" if debug else "0", "HYDRA_FULL_ERROR": "0"}
    env |= env_extra or {}
    args = [sys.executable, "-m", "recipe", "logger.quiet=true", *overrides]
    if not any(o.startswith("hydra.run.dir=") for o in overrides):
        args.append(f"hydra.run.dir={run_dir}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return proc, (cpu_s, wall_s)


def _assert_one_line_error(
    proc: subprocess.CompletedProcess, elapsed: tuple[float, float], *named: str
) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for text in named:
        assert text in errors[0], errors[0]
    cpu_s, wall_s = elapsed
    assert cpu_s < CPU_BOUND_S and wall_s < WALL_BOUND_S, (cpu_s, wall_s, errors[0])
    return errors[0]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _copy_of_tiny_model(tmp: Path, *drop: str) -> Path:
    """The embedded default model's directory, copied without the files named in ``drop``."""
    from recipe.tiny import ensure_tiny_model

    copy = Path(shutil.copytree(ensure_tiny_model(), tmp / "model"))
    for name in drop:
        (copy / name).unlink()
    return copy


def _case_files(tmp: Path, case: str) -> tuple[list[str], list[str]]:
    """Overrides and the texts the error line must name, for cases that need files."""
    if case == "missing model path":
        missing = tmp / "no_such_model"
        return [f"model.path={missing}"], ["model.path=", str(missing)]
    if case == "directory that is not a causal LM":
        _write(tmp / "t5" / "config.json", json.dumps({"model_type": "t5"}))
        return [f"model.path={tmp / 't5'}"], ["model.path=", "not a causal LM"]
    if case == "model without weights":
        model = _copy_of_tiny_model(tmp, "model.safetensors")
        return [f"model.path={model}"], [str(model), "no model weights", "found: config.json"]
    if case == "model without tokenizer":
        model = _copy_of_tiny_model(tmp, "tokenizer.json", "tokenizer_config.json")
        return [f"model.path={model}"], [str(model), "no tokenizer files", "model.safetensors"]
    if case == "missing judge model":
        missing = tmp / "no_such_judge"
        return [f"reward.judge.model={missing}"], ["reward.judge.model=", str(missing)]
    if case == "judge context past the judge model's":
        model = _copy_of_tiny_model(tmp)  # 2,048 positions; the judge's default context 4,096
        return [f"reward.judge.model={model}"], [
            "reward.judge.max_model_len=4096 is invalid",
            "the judge model's context, 2048 tokens",
        ]
    if case == "malformed dataset row":
        bad = dict(ROW)
        del bad["reward_model"]
        path = _write(tmp / "train.jsonl", json.dumps(ROW) + "\n" + json.dumps(bad) + "\n")
        return [f"data.train_files=[{path}]"], [str(path), "line 2", "reward_model missing"]
    if case == "empty dataset":
        path = _write(tmp / "train.jsonl", "")
        return [f"data.train_files=[{path}]"], [str(path), "no rows"]
    if case == "output directory under a file":
        blocker = _write(tmp / "a_file", "")
        return [f"hydra.run.dir={blocker / 'run'}"], ["hydra.run.dir=", str(blocker / "run")]
    if case == "resume path that is not a checkpoint":
        return ["trainer.resume_mode=/nonexistent/dir"], [
            "trainer.resume_mode=",
            "/nonexistent/dir",
        ]
    raise AssertionError(case)


FILE_CASES = [
    "missing model path",
    "directory that is not a causal LM",
    "model without weights",
    "model without tokenizer",
    "missing judge model",
    "judge context past the judge model's",
    "malformed dataset row",
    "empty dataset",
    "output directory under a file",
    "resume path that is not a checkpoint",
]


KNOB_CASES: list[tuple[list[str], str]] = [
    (["async_training.staleness_threshold=-0.5"], "async_training.staleness_threshold=-0.5"),
    (["async_training.require_batches=0"], "async_training.require_batches=0"),
    (
        ["async_training.trigger_parameter_sync_step=0"],
        "async_training.trigger_parameter_sync_step=0",
    ),
    (
        ["mode=sync", "data.train_batch_size=30", "actor.ppo_mini_batch_size=16"],
        "data.train_batch_size=30",
    ),
    (["reward.custom_fn=recipe.reward.scorers:no_such_scorer"], "reward.custom_fn="),
    (["actor.lrr=1e-5"], "unknown key 'actor.lrr' in 'actor.lrr=1e-5': did you mean actor.lr"),
    (["reward.judge.mode=listwise"], "reward.judge.mode="),
    (
        [
            "reward.judge.base_url=http://127.0.0.1:9/v1",
            "reward.judge.endpoint_model=m",
            "reward.judge.mode=pairwise",
            "rollout.n=1",
        ],
        "rollout.n=1",
    ),
    (["rollout.n=1.5"], "rollout.n=1.5 is invalid: expected an integer"),
    (["rollout.n=[1,2]"], "rollout.n=[1, 2] is invalid: expected an integer"),
    (
        ["actor_rollout_ref.actor.optim.lr=1e-6"],
        "actor_rollout_ref.actor.optim.lr is verl's name; here it is actor.lr (actor.lr=1e-6)",
    ),
    (
        ["trainer.n_gpus_per_node=8"],
        "set actor.n_gpus_per_node (trainer ranks per node) and rollout.n_gpus_per_node",
    ),
    (["hydra.job.env_set.FOO=1"], "+hydra.job.env_set.FOO=1"),
    (
        [
            "rollout.multi_turn.enable=true",
            f"rollout.multi_turn.environment={agent_envs.PATH}:HalfSaved",
        ],
        "rollout.multi_turn.environment: HalfSaved implements state_dict but not load_state_dict",
    ),
    (
        [
            "mode=sync",
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.environment=recipe.agent.builtin:NoSuchEnv",
        ],
        "rollout.multi_turn.environment='recipe.agent.builtin:NoSuchEnv'",
    ),
    (
        [
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.agent_command=no-such-agent --episode",
        ],
        "rollout.multi_turn.agent_command='no-such-agent --episode': command not found",
    ),
    (
        [
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.agent=recipe.agent.builtin:Calculator",
        ],
        "rollout.multi_turn.agent='recipe.agent.builtin:Calculator': 'Calculator' is not "
        "an async function",
    ),
]
KNOB_IDS = [
    "negative staleness",
    "require_batches=0",
    "trigger_parameter_sync_step=0",
    "batch sizes that do not divide",
    "unknown reward function",
    "unknown key",
    "unknown judge mode",
    "pairwise judge of one response",
    "float for an integer",
    "list for an integer",
    "verl key",
    "verl key with no one-to-one equivalent",
    "missing + on a hydra key",
    "environment with one state hook",
    "unknown environment class",
    "agent command not found",
    "agent that is not an async function",
]
KNOBS = dict(zip(KNOB_IDS, KNOB_CASES, strict=True))
ONE_PER_STAGE = [
    "unknown key",  # the overrides, before Hydra composes
    "negative staleness",  # load_config
    "output directory under a file",  # the run directory (a Hydra callback)
    "malformed dataset row",  # the data, in the recipe's constructor
    "model without weights",  # the model, in the recipe's constructor
]
"""The cases that also run as a subprocess of their own."""


def _case(tmp: Path, case: str) -> tuple[list[str], list[str]]:
    """Overrides (the run directory included) and the texts the error line must name."""
    if case in KNOBS:
        overrides, named = KNOBS[case]
        overrides, names = list(overrides), [named]
    else:
        overrides, names = _case_files(tmp, case)
    if not any(o.startswith("hydra.run.dir=") for o in overrides):
        overrides.append(f"hydra.run.dir={tmp / 'run'}")
    return ["logger.quiet=true", *overrides], names


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict[str, tuple[dict, list[str]]]:
    """Every case run in one interpreter: case -> (its result, the texts to name). In
    mode=sync: fully_async runs the same checks while Ray starts beside them (seconds a
    case), which the subprocess cases (the default mode) and the prompts-too-long case keep."""
    cases = {c: _case(tmp_path_factory.mktemp("case"), c) for c in [*FILE_CASES, *KNOBS]}
    for argv, _ in cases.values():  # sync: the same checks, without a Ray start beside them
        if not any(a.startswith("mode=") for a in argv):
            argv.insert(1, "mode=sync")
    env = {**os.environ, "RECIPE_DEBUG": "0", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.cli_batch"],
        input=json.dumps([argv for argv, _ in cases.values()]),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = [
        json.loads(line[len(cli_batch.MARK) :])
        for line in proc.stdout.splitlines()
        if line.startswith(cli_batch.MARK)
    ]
    assert len(results) == len(cases), proc.stderr[-3000:]
    return {c: (r, named) for (c, (_, named)), r in zip(cases.items(), results, strict=True)}


@pytest.mark.parametrize("case", [*FILE_CASES, *KNOB_IDS])
def test_bad_input_fails_at_startup_naming_it(case, batch):
    result, named = batch[case]
    proc = subprocess.CompletedProcess([], result["code"], "", result["stderr"])
    _assert_one_line_error(proc, (result["cpu_s"], result["wall_s"]), *named)


@pytest.mark.parametrize("case", ONE_PER_STAGE)
def test_the_command_line_process_fails_the_same_way(case, tmp_path):
    overrides, named = _case(tmp_path, case)
    proc, elapsed = _run(tmp_path / "run", *overrides[1:])
    _assert_one_line_error(proc, elapsed, *named)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_output_directory_fails_at_startup_naming_it(tmp_path):
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        proc, elapsed = _run(tmp_path, f"hydra.run.dir={read_only / 'run'}")
    finally:
        read_only.chmod(0o755)
    _assert_one_line_error(proc, elapsed, "hydra.run.dir=", str(read_only / "run"))


def test_debug_flag_shows_the_traceback(tmp_path):
    proc, _ = _run(tmp_path / "run", "async_training.require_batches=0", debug=True)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "async_training.require_batches" in proc.stderr


def test_prompts_too_long_fail_while_ray_starts_and_leave_no_ray_behind(tmp_path):
    """fully_async checks the prompts' lengths while Ray starts (the one check that does):
    the same one line and exit 2, Ray shut down before the exit (its processes name its
    temporary folder)."""
    ray_tmp = tmp_path / "ray"
    proc, elapsed = _run(
        tmp_path / "run",
        "mode=fully_async",
        "data.max_prompt_length=2",
        env_extra={"RAY_TMPDIR": str(ray_tmp)},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "data.max_prompt_length=2" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert elapsed[1] < WALL_BOUND_S, elapsed
    left = subprocess.run(["pgrep", "-f", str(ray_tmp)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"Ray processes left: {left.stdout}"
