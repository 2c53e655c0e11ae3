"""The peer benchmark: verl's GRPO and ours on the same GPU under the same terms
(``python -m recipe.tools.bench.peers``; ``__main__.py`` has the flow and the keys)."""
