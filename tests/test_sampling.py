"""SamplingParams validation and the sampler's filters."""

import numpy as np
import pytest

from edgeinfer.sampling import (SamplingParams, Sampler, apply_min_p, apply_penalties, apply_top_k, apply_top_p)


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", "hot"), ("top_p", 0.0), ("top_p", 1.5),
    ("top_k", -1), ("top_k", 2.5), ("min_p", 1.5), ("repetition_penalty", 0.0), ("presence_penalty", 3.0),
    ("frequency_penalty", -2.5), ("max_tokens", 0), ("max_tokens", True), ("stop", [""]), ("stop", [3]),
    ("seed", -1), ("seed", 1.5), ("logprobs", 21), ("stop_token_ids", [-1]), ("ignore_eos", "yes"),
    ("repeat_last_n", -2), ("repeat_last_n", 1.5),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} "):
        SamplingParams(**{field: value})


def test_stop_string_becomes_tuple():
    assert SamplingParams(stop="END").stop == ("END",)


def test_greedy_picks_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert Sampler(SamplingParams(temperature=0))(logits, [], []) == 1


def test_same_seed_same_choices():
    logits = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    a = Sampler(SamplingParams(seed=42))
    b = Sampler(SamplingParams(seed=42))
    c = Sampler(SamplingParams(seed=43))
    sa = [a(logits, [], []) for _ in range(20)]
    assert sa == [b(logits, [], []) for _ in range(20)]
    assert sa != [c(logits, [], []) for _ in range(20)]


def test_top_k_keeps_k():
    x = apply_top_k(np.array([1.0, 5.0, 3.0, 4.0, 2.0]), 2)
    assert list(np.isfinite(x)) == [False, True, False, True, False]


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    x = apply_top_p(np.log(probs), 0.7)
    assert list(np.isfinite(x)) == [True, True, False, False]
    x = apply_top_p(np.log(probs), 0.85)
    assert list(np.isfinite(x)) == [True, True, True, False]


def test_min_p_is_relative_to_the_best():
    probs = np.array([0.6, 0.3, 0.06, 0.04])
    x = apply_min_p(np.log(probs), 0.09)  # keep p >= 0.054
    assert list(np.isfinite(x)) == [True, True, True, False]


def test_penalties():
    x = np.array([2.0, -2.0, 1.0, 1.0])
    out = apply_penalties(x.copy(), SamplingParams(repetition_penalty=2.0), [0], [1])
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, 1.0])
    out = apply_penalties(x.copy(), SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [0], [2, 2, 3])
    np.testing.assert_allclose(out, [2.0, -2.0, 1.0 - 0.5 - 0.5, 1.0 - 0.5 - 0.25])


def test_repeat_last_n_is_how_many_last_tokens_the_repetition_penalty_sees():
    x = np.array([2.0, 2.0, 2.0, 2.0, 2.0])
    prompt, output = [0, 1], [2, 3]

    def penalised(n):
        out = apply_penalties(x.copy(), SamplingParams(repetition_penalty=2.0, repeat_last_n=n), prompt, output)
        return [i for i in range(5) if out[i] != 2.0]

    assert penalised(-1) == [0, 1, 2, 3]  # the default: the whole context, prompt and output
    assert penalised(0) == []  # off
    assert penalised(1) == [3]
    assert penalised(3) == [1, 2, 3]  # reaching back into the prompt
    assert penalised(100) == [0, 1, 2, 3]
    assert SamplingParams().repeat_last_n == -1


def test_temperature_sampling_follows_the_distribution():
    logits = np.log(np.array([0.7, 0.2, 0.1]))
    s = Sampler(SamplingParams(seed=0, temperature=1.0))
    counts = np.bincount([s(logits, [], []) for _ in range(3000)], minlength=3) / 3000
    np.testing.assert_allclose(counts, [0.7, 0.2, 0.1], atol=0.03)  # 3000 draws: std < 0.009


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-6])
def test_a_tiny_temperature_is_the_greedy_choice_not_nan(temperature):
    """logits / 1e-300 overflow to inf: the distribution must still be the point mass on the largest logit
    (what the temperature tends to), never NaN probabilities."""
    logits = np.array([3.0, 5.0, -1.0, 4.9], np.float32)
    s = Sampler(SamplingParams(seed=0, temperature=temperature))
    probs = s.probs(logits, [], [])
    assert not np.isnan(probs).any()
    np.testing.assert_array_equal(probs, [0.0, 1.0, 0.0, 0.0])
    assert s(logits, [], []) == 1
