"""Agents written against the OpenAI API, runnable as ``rollout.multi_turn.agent``."""
