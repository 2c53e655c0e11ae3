"""``python -m recipe.tools.export``: a LoRA run's checkpoint as something to serve.

    python -m recipe.tools.export CHECKPOINT_DIR --adapter OUT   the adapter alone (PEFT folder:
                                                           vLLM's LoRARequest(lora_path=OUT),
                                                           peft.PeftModel.from_pretrained)
    python -m recipe.tools.export CHECKPOINT_DIR --merged OUT    base + adapter merged by peft's
                                                           merge_and_unload: a plain Hugging
                                                           Face folder (config, weights,
                                                           tokenizer)

CHECKPOINT_DIR is a ``checkpoints/step_N/`` of a run with ``actor.lora.rank > 0``. The merged
folder is built on the base the checkpoint names (``base_model.json``), after checking that its
weights are still the ones the adapter was trained on. OUT is written aside, then renamed.
Bad input: one line on stderr, exit code 2. A checkpoint of full fine-tuning already is a
Hugging Face folder (serve it as it is).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from recipe.utils.adapter_file import read_adapter_config
from recipe.utils.weights_file import PARTIAL_SUFFIX
from recipe.workers.trainer.lora import (
    ADAPTER_DIR,
    BASE_RECORD_NAME,
    base_record,
    check_same_base,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipe.tools.export", description=__doc__)
    parser.add_argument("checkpoint", type=Path, help="a LoRA run's checkpoints/step_N/")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--adapter", type=Path, help="write the PEFT adapter folder here")
    out.add_argument("--merged", type=Path, help="write the merged Hugging Face folder here")
    return parser


def check_lora_checkpoint(checkpoint: Path) -> dict[str, object]:
    """The checkpoint's base record; ``ValueError`` (one line) unless it is a LoRA one."""
    if not checkpoint.is_dir():
        raise ValueError(f"checkpoint {checkpoint}: no such directory")
    record = checkpoint / BASE_RECORD_NAME
    if not record.is_file():
        full = (checkpoint / "config.json").is_file()
        raise ValueError(
            f"checkpoint {checkpoint} holds no LoRA adapter (no {BASE_RECORD_NAME})"
            + (": it is full fine-tuning's Hugging Face folder, serve it as it is" if full else "")
        )
    read_adapter_config(checkpoint / ADAPTER_DIR)
    base: dict[str, object] = json.loads(record.read_text())
    return base


def export_adapter_folder(checkpoint: Path, out: Path) -> None:
    check_lora_checkpoint(checkpoint)
    _written_aside(out, lambda partial: shutil.copytree(checkpoint / ADAPTER_DIR, partial))


def export_merged_folder(checkpoint: Path, out: Path) -> None:
    """Base (checked against the checkpoint's record) + adapter, merged, as an HF folder."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    from recipe.workers.trainer.fsdp_utils import copy_tokenizer

    base_path = str(check_lora_checkpoint(checkpoint)["path"])
    if not Path(base_path).is_dir():
        raise ValueError(f"checkpoint {checkpoint}: its base {base_path} is not on this node")
    check_same_base(checkpoint, base_record(base_path))
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(base, str(checkpoint / ADAPTER_DIR)).merge_and_unload()

    def write(partial: Path) -> None:
        merged.save_pretrained(partial)
        copy_tokenizer(base_path, partial)

    _written_aside(out, write)


def _written_aside(out: Path, write: Callable[[Path], object]) -> None:
    if out.exists():
        raise ValueError(f"{out} exists: name a new folder")
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    if partial.exists():
        shutil.rmtree(partial)
    write(partial)
    partial.rename(out)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        out = args.adapter if args.adapter is not None else args.merged
        if out.exists():
            raise ValueError(f"{out} exists: name a new folder")
        if args.adapter is not None:
            export_adapter_folder(args.checkpoint, args.adapter)
            print(args.adapter)
        else:
            export_merged_folder(args.checkpoint, args.merged)
            print(args.merged)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
