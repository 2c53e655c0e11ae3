"""Observations to token ids, appended after what the model generated (never re-rendered).

Without a chat template (a base model, the embedded tiny model) an observation's text is
tokenised as it is and appended; chat messages are joined by newlines.

With a chat template, a new message is rendered as a *delta*: the text the template adds
after a finished assistant turn,

    render([u, a] + new, add_generation_prompt=True) minus render([u, a])    (u, a: probes)

preceded by the template's close of the assistant turn that the model did not generate
itself: after a turn that stopped at EOS, what the template writes after the EOS text (e.g.
Qwen's newline after ``<|im_end|>``); after a turn cut by its budget, the whole close.

A template can only be used this way when rendering is prefix-stable and tokenising the
pieces separately gives the ids of the whole; ``ObservationRenderer`` checks both on a
probe conversation when it is built, so a template that cannot render a delta exactly fails
at startup (``ValueError``), not as silently shifted masks later.
"""

from __future__ import annotations

from typing import Any

from recipe.agent.episode import Observation
from recipe.data.prompts import has_chat_template, render_prompt

_PROBE_USER = "What is 2 + 3?"
_PROBE_ANSWER = "The answer is 5."
_PROBE_OBSERVATION = "Checked: 5 is right."


class ObservationRenderer:
    """Token ids of the first observation (the prompt) and of later observations."""

    def __init__(self, tokenizer: Any, eos_token_ids: list[int], observation_role: str = "user"):
        self.tokenizer, self.role = tokenizer, observation_role
        self.templated = has_chat_template(tokenizer)
        self._eos_ids = set(eos_token_ids)
        self._close_after_eos = self._full_close = ""
        if self.templated:
            self._close_after_eos, self._full_close = self._assistant_close(eos_token_ids)
            self._check_exact()

    def is_eos(self, token_id: int) -> bool:
        """Whether ``token_id`` ends a model turn."""
        return token_id in self._eos_ids

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, observation: Observation) -> list[int]:
        """The first observation rendered as ``recipe.data.prompts`` renders a prompt."""
        return self.encode(render_prompt(self.tokenizer, observation))

    def observation_ids(self, observation: Observation, last_turn_ids: list[int]) -> list[int]:
        """Ids to append after a model turn that generated ``last_turn_ids``."""
        if not self.templated:
            if isinstance(observation, str):
                return self.encode(observation)
            return self.encode("\n".join(m["content"] for m in observation))
        stopped = bool(last_turn_ids) and last_turn_ids[-1] in self._eos_ids
        close = self._close_after_eos if stopped else self._full_close
        return self.encode(close + self._delta(self._messages(observation)))

    def _messages(self, observation: Observation) -> list[dict[str, str]]:
        if isinstance(observation, str):
            return [{"role": self.role, "content": observation}]
        return list(observation)

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def _probe(self) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": _PROBE_USER},
            {"role": "assistant", "content": _PROBE_ANSWER},
        ]

    def _delta(self, messages: list[dict[str, str]]) -> str:
        base = self._render(self._probe(), add_generation_prompt=False)
        full = self._render(self._probe() + messages, add_generation_prompt=True)
        if not full.startswith(base):
            raise ValueError(
                f"the chat template of {self._name()} re-renders earlier messages when "
                "messages are added (not prefix-stable), so observations cannot be appended as "
                "deltas: use text observations with a base model, or a prefix-stable template"
            )
        return full[len(base) :]

    def _assistant_close(self, eos_token_ids: list[int]) -> tuple[str, str]:
        """(what the template writes after the EOS text, its whole close of a turn)."""
        text = self._render(self._probe(), add_generation_prompt=False)
        at = text.rfind(_PROBE_ANSWER)
        if at < 0:
            raise ValueError(
                f"the chat template of {self._name()} does not render an assistant message's "
                "content verbatim, so model turns cannot be appended token-in/token-out"
            )
        close = text[at + len(_PROBE_ANSWER) :]
        for eos in eos_token_ids:
            eos_text = self.tokenizer.decode([eos])
            if eos_text and close.startswith(eos_text):
                return close[len(eos_text) :], close
        return close, close

    def _check_exact(self) -> None:
        """Prompt, a model turn ending at EOS and an observation, tokenised piece by piece,
        must equal the whole conversation rendered and tokenised at once."""
        prompt = self.prompt_ids([self._probe()[0]])
        answer = self.encode(_PROBE_ANSWER)
        eos = [i for i in self._eos_ids if self._full_close.startswith(self.tokenizer.decode([i]))]
        turn = answer + eos[:1]
        observation = self.observation_ids(_PROBE_OBSERVATION, turn)
        whole = [*self._probe(), {"role": self.role, "content": _PROBE_OBSERVATION}]
        expected = self.encode(self._render(whole, add_generation_prompt=True))
        if prompt + turn + observation != expected:
            raise ValueError(
                f"the chat template of {self._name()} cannot render an observation as an exact "
                "token delta (the pieces tokenised apart differ from the conversation "
                "tokenised at once): use text observations with a base model, or another "
                "template"
            )

    def _name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
