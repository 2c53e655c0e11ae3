"""Every checkpoint holds fingerprints of the run's train and val prompts, and a resume whose
prompts differ is refused with one line naming the set (exit code 2 from the command line);
a checkpoint written before fingerprints were kept resumes with a warning."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.checkpoint.store import STATE_FILE, checkpoint_dir, read_state, write_checkpoint
from recipe.config import load_config
from recipe.data import reasoning_gym_entries
from recipe.data.config import DataConfig
from recipe.data.dataset import build_datasets
from recipe.data.fingerprint import FINGERPRINTS_KEY, prompt_fingerprints
from recipe.data.reasoning_gym import ReasoningGymConfig
from recipe.protocol import PromptRecord
from recipe.run.checkpointing import RunCheckpointer

REPO = Path(__file__).resolve().parents[2]
Sets = tuple[list[PromptRecord], list[PromptRecord]]


class FakeRanks:
    """The two calls ``RunCheckpointer.save`` makes of the trainer ranks."""

    def save_hf(self, path: Path) -> None:
        (path / "model.safetensors").write_bytes(b"weights")

    def save_train_state(self, path: Path) -> None:
        path.mkdir()
        (path / "optimizer.pt").write_bytes(b"adam")


def _checkpointer(run_dir: Path, sets: Sets) -> RunCheckpointer:
    cfg = load_config({"mode": "sync", "trainer": {"resume_mode": "auto"}})
    return RunCheckpointer(cfg, run_dir, train=sets[0], val=sets[1])


def _save(run_dir: Path, sets: Sets) -> Path:
    return _checkpointer(run_dir, sets).save(FakeRanks(), step=2, version=2, state={})


def _file_sets(tmp_path: Path, answer: str) -> Sets:
    rows = [{"prompt": f"{i}+1=", "data_source": "arithmetic", "reward_model": {"ground_truth": a}}
            for i, a in enumerate(["1", "2", answer])]  # fmt: skip
    path = tmp_path / "train.jsonl"  # one name: the uids stay, a ground truth changes
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return build_datasets(DataConfig(source="files", train_files=[str(path)]))


def _synthetic_sets(seed: int) -> Sets:
    return build_datasets(DataConfig(num_train_prompts=8, num_val_prompts=4, seed=seed))


def _reasoning_gym_sets(max_terms: int) -> Sets:
    pytest.importorskip("reasoning_gym")
    rg = ReasoningGymConfig(dataset="chain_sum", config={"min_terms": 2, "max_terms": max_terms})
    cfg = DataConfig(
        source="reasoning_gym", num_train_prompts=8, num_val_prompts=4, reasoning_gym=rg
    )
    return build_datasets(cfg)


@pytest.fixture(autouse=True)
def generate_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # chain_sum does not follow the hash seed: no child process (~1 s) needed here.
    monkeypatch.setattr(reasoning_gym_entries, "hash_seed_is_pinned", lambda: True)


def test_a_checkpoint_holds_the_fingerprints_of_both_prompt_sets(tmp_path: Path) -> None:
    train, val = _synthetic_sets(seed=1)
    path = _save(tmp_path, (train, val))
    saved = read_state(path)[FINGERPRINTS_KEY]
    assert saved == prompt_fingerprints(train, val)
    assert saved["train"]["num_prompts"] == 8 and saved["val"]["num_prompts"] == 4
    assert saved["train"]["sha256"] != saved["val"]["sha256"]


@pytest.mark.parametrize("source", ["files", "synthetic", "reasoning_gym"])
def test_a_resume_with_other_train_prompts_is_refused_naming_the_set(
    tmp_path: Path, source: str
) -> None:
    before, after = {
        "files": lambda: (_file_sets(tmp_path, "3"), _file_sets(tmp_path, "4")),
        "synthetic": lambda: (_synthetic_sets(seed=1), _synthetic_sets(seed=2)),
        "reasoning_gym": lambda: (_reasoning_gym_sets(3), _reasoning_gym_sets(4)),
    }[source]()
    assert [r.uid for r in before[0]] == [r.uid for r in after[0]]  # same uids, other prompts
    path = _save(tmp_path / "run", before)
    with pytest.raises(ValueError) as caught:
        _checkpointer(tmp_path / "run", after)
    message = str(caught.value)
    assert message.startswith(
        f"data: the train prompts differ from those of checkpoint {path} (fingerprint "
    )
    assert "the data files, data.* settings or the reasoning-gym version changed" in message
    assert "\n" not in message
    assert _checkpointer(tmp_path / "run", before).resume_from == path  # the same data resumes


def test_a_resume_with_other_val_prompts_is_refused_naming_the_set(tmp_path: Path) -> None:
    train, val = _synthetic_sets(seed=1)
    _save(tmp_path, (train, val))
    with pytest.raises(
        ValueError, match=r"^data: the val prompts differ .*, 4 prompts then, 3 now"
    ):
        _checkpointer(tmp_path, (train, val[:3]))


def test_a_checkpoint_without_fingerprints_resumes_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sets = _synthetic_sets(seed=1)
    path = _save(tmp_path, sets)
    state = json.loads((path / STATE_FILE).read_text())
    del state[FINGERPRINTS_KEY]  # as an older version wrote it

    def fill(partial: Path) -> None:
        (partial / STATE_FILE).write_text(json.dumps(state))

    old = write_checkpoint(tmp_path, 4, 4, fill)
    with caplog.at_level(logging.WARNING, logger="recipe.run.checkpointing"):
        checkpointer = _checkpointer(tmp_path, _synthetic_sets(seed=2))
    assert checkpointer.resume_from == old
    assert f"checkpoint {old} holds no prompt fingerprints" in caplog.text


@pytest.mark.model  # the run reads the tiny model's tokenizer before it checks the checkpoint
def test_the_command_line_refuses_other_prompts_with_exit_code_2(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    sizes = {"num_train_prompts": 64, "num_val_prompts": 8}
    cfg = load_config({"model": {"path": str(tiny_model_path)}, "data": sizes})
    train, val = build_datasets(cfg.data)
    state = {
        "mode": cfg.mode, "global_step": 2, "param_version": 2,
        "num_train_prompts": len(train), FINGERPRINTS_KEY: prompt_fingerprints(train, val),
    }  # fmt: skip
    write_checkpoint(tmp_path, 2, 2, lambda partial: (partial / STATE_FILE).write_text(
        json.dumps(state)))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "recipe", f"model.path={tiny_model_path}", "data.seed=2",
         "data.num_train_prompts=64", "data.num_val_prompts=8", "trainer.device=cpu",
         f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: data: the train prompts differ from those of checkpoint "
        f"{checkpoint_dir(tmp_path, 2)}"
    ), proc.stderr[-2000:]
