"""An agent run as a command per episode (``rollout.multi_turn.agent_command``), the way a
harness in another process or language is: only the standard library, HTTP to
``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY``, the prompt's record on stdin, the reward on
its last stdout line.

    python command_agent.py SIGNAL_DIR

Two chat requests with a tool; the reward is ``openai_agents.digest`` of the last content
(a test recomputes it from the trained tokens). By the record's uid:

    fail-*   exits 3 after its first request (an agent that crashed)
    hold-*   after its first request writes ``SIGNAL_DIR/<uid>.<pid>`` and waits (at most
             120 s) for ``SIGNAL_DIR/go`` before its second: a test pauses the worker there
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
import zlib
from pathlib import Path

TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "parameters": {"type": "object", "properties": {}}},
    }
]


def digest(text: str) -> float:
    """``openai_agents.digest``, restated: this file runs without the project on its path."""
    return (zlib.crc32(text.encode()) % 1000) / 1000


def chat(messages: list[dict]) -> dict:
    body = {"model": "policy", "messages": messages, "tools": TOOLS, "temperature": 0.3}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)["choices"][0]["message"]


def wait_for(path: Path, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not path.exists():
        if time.monotonic() > end:
            sys.exit(f"{path} did not appear within {deadline_s:g} s")
        time.sleep(0.05)


def main() -> None:
    signals = Path(sys.argv[1])
    record = json.loads(sys.stdin.read())
    uid = record["uid"]
    messages = [{"role": "user", "content": record["prompt"]}]
    message = chat(messages)
    print(f"first turn: {len(message.get('content') or '')} characters")  # a log line
    if uid.startswith("fail-"):
        sys.exit(3)
    if uid.startswith("hold-"):
        (signals / f"{uid}.{os.getpid()}").touch()
        wait_for(signals / "go", 120.0)
    messages += [message, {"role": "user", "content": "Again."}]
    last = chat(messages)
    print(json.dumps({"reward": digest(last.get("content") or "")}))


if __name__ == "__main__":
    main()
