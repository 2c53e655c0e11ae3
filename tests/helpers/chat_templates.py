"""Chat templates for tests of the agent endpoint: one that renders ``tools``, assistant
``tool_calls`` (hermes-style ``<tool_call>`` JSON) and ``role: tool`` messages, on the tiny
byte-level tokenizer's special tokens."""

from __future__ import annotations

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
