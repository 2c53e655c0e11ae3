"""Chat templates for tests of the agent endpoint: one that renders ``tools``, assistant
``tool_calls`` (hermes-style ``<tool_call>`` JSON) and ``role: tool`` messages, on the tiny
byte-level tokenizer's special tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from recipe.tiny import EOS_TOKEN


def tools_template(eos: str) -> str:
    """The template for a tokenizer whose end-of-turn text is ``eos``."""
    return (
        "{% if tools %}<|im_start|>system\n"
        "{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You help.' }}\n"
        "<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>" + eos + "\n"
        "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n"
        "{{ messages[0]['content'] }}" + eos + "\n{% endif %}"
        "{% for m in messages %}"
        "{% if m['role'] == 'system' %}"
        "{% elif m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'] or '' }}"
        "{% for c in m['tool_calls'] or [] %}<tool_call>"
        '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}'
        "</tool_call>{% endfor %}" + eos + "\n"
        "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>{{ m['content'] }}"
        "</tool_response>" + eos + "\n"
        "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}" + eos + "\n{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


TOOLS_TEMPLATE = tools_template(EOS_TOKEN)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
        },
    }
]


def copy_with_tools_template(model: Path, dest: Path, eos: str) -> Path:
    """A copy of the model folder ``model`` at ``dest`` whose tokenizer carries
    ``tools_template(eos)`` (as a user's chat model); returns ``dest``."""
    shutil.copytree(model, dest)
    config_file = dest / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = tools_template(eos)
    config_file.write_text(json.dumps(config))
    return dest
