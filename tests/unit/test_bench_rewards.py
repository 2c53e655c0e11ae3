"""The benchmark reward gives a random model's groups a gradient (recipe/tools/bench/rewards.py)."""

from __future__ import annotations

import random

from recipe.reward.custom import load_custom_fn
from recipe.tiny import build_tokenizer
from recipe.tools.bench.models import SHAPES

SPEC = "recipe.tools.bench.rewards:decodes_to_text"
BENCH_VOCAB = SHAPES["0.5B"].vocab_size


def test_it_loads_as_a_custom_fn_and_scores_text_against_no_text():
    fn = load_custom_fn(SPEC)
    assert fn(data_source="any", solution_str="", ground_truth="7") == 0.0
    assert fn(data_source="any", solution_str="?B", ground_truth="7", extra_info={}) == 1.0


def test_random_responses_of_the_bench_vocabulary_give_most_groups_both_rewards(tmp_path):
    """The premise, on the tokenizer the bench models ship: ids sampled uniformly over the
    shape's vocabulary decode to text about as often as not, so groups are not constant."""
    tokenizer = build_tokenizer(tmp_path, model_max_length=4096)
    fn = load_custom_fn(SPEC)
    rng = random.Random(0)

    def reward() -> float:
        ids = [rng.randrange(BENCH_VOCAB) for _ in range(384)]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return fn(data_source="bench", solution_str=text, ground_truth=None)

    groups = [[reward() for _ in range(8)] for _ in range(50)]
    share = sum(map(sum, groups)) / 400
    assert 0.3 < share < 0.6
    mixed = sum(len(set(group)) > 1 for group in groups)
    assert mixed >= 45  # a constant group has no advantage; at 0.43 about 98% are mixed
