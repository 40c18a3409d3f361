"""The noise statistic and the confirmation criterion on constructed sample sets."""

from __future__ import annotations

import random

import pytest

from tunefleet import agreement
from tunefleet.agreement import compare, noise, quantile, rank_test


def draws(seed: int, n: int, base: float = 1e-3, sigma: float = 0.02) -> list[float]:
    rng = random.Random(seed)
    return [base * rng.lognormvariate(0.0, sigma) for _ in range(n)]


def test_quantiles_interpolate_like_percentile_cont() -> None:
    s = [1.0, 2.0, 3.0, 4.0]
    assert quantile(s, 0.5) == 2.5
    assert quantile(s, 0.25) == pytest.approx(1.75)
    assert quantile(s, 0.75) == pytest.approx(3.25)
    assert noise(s) == pytest.approx(1.5 / 2.5)


def test_noise_ignores_a_few_huge_outliers() -> None:
    clean = draws(1, 200)
    spiky = clean[:-4] + [50e-3] * 4
    assert noise(clean) < 0.05
    assert noise(spiky) < 0.05
    assert agreement.is_noisy([1.0, 1.2, 1.5, 2.0, 3.0])


def test_re_measurements_of_one_distribution_agree() -> None:
    for seed in range(20):
        verdict = compare(draws(seed, 60), draws(1000 + seed, 60))
        assert verdict.agrees, verdict


def test_ten_percent_apart_disagrees() -> None:
    verdict = compare(draws(1, 50), draws(2, 50, base=1.1e-3))
    assert not verdict.agrees
    assert verdict.spread == pytest.approx(0.1, abs=0.02)
    assert "significant" in verdict.describe()


def test_twice_as_slow_disagrees_even_on_ten_noisy_samples() -> None:
    assert not compare(draws(1, 10, sigma=0.2), draws(2, 10, base=2e-3, sigma=0.2)).agrees


def test_heavy_tails_agree_when_the_medians_agree() -> None:
    a = draws(3, 100)
    b = draws(4, 100)
    b[:8] = [x * 30 for x in b[:8]]  # descheduled launches: a few huge samples
    verdict = compare(a, b)
    assert verdict.agrees, verdict


def test_under_the_floor_always_agrees() -> None:
    # 2 % apart on tight samples: the test would see it, the floor says it is resolution.
    a, b = draws(5, 200, sigma=0.001), draws(6, 200, base=1.02e-3, sigma=0.001)
    assert rank_test(a, b) < 1e-6
    assert compare(a, b).agrees


def test_identical_constant_samples_agree() -> None:
    assert rank_test([1.0] * 10, [1.0] * 10) == 1.0
    assert compare([1.0] * 10, [1.0] * 10).agrees


def test_false_alarm_rate_of_the_rank_test_is_alpha() -> None:
    """Over many seeded pairs from one distribution, without the floor, the test calls a
    disagreement about ALPHA of the time (its stated false-alarm rate); with the floor even
    less often."""
    pairs = 3000
    alarms = alarms_floored = 0
    for i in range(pairs):
        n = 10 + i % 40
        a, b = draws(2 * i, n, sigma=0.05), draws(2 * i + 1, n, sigma=0.05)
        alarms += not compare(a, b, floor=0.0).agrees
        alarms_floored += not compare(a, b).agrees
    rate = alarms / pairs
    assert 0.002 <= rate <= 0.02, rate
    assert alarms_floored <= alarms


def test_five_samples_each_twice_as_slow_disagree_exactly() -> None:
    """At 5 + 5 samples complete separation has an exact p of 2/252 (under ALPHA); the normal
    approximation would say 0.012 and let it pass."""
    a = draws(7, 5, sigma=0.05)
    b = draws(8, 5, base=2e-3, sigma=0.05)
    assert rank_test(a, b) == pytest.approx(2 / 252)
    assert not compare(a, b).agrees


def test_exact_and_approximate_p_values_are_close_where_both_apply() -> None:
    a, b = draws(9, 20, sigma=0.05), draws(10, 20, base=1.03e-3, sigma=0.05)
    exact = rank_test(a, b)
    approx = rank_test([*a, a[0]], [*b, a[0]])  # one tie: the approximation
    assert exact == pytest.approx(approx, rel=0.5, abs=0.02)


def test_the_verdict_reads_before_its_figures_and_the_noise_is_named_apart() -> None:
    from tunefleet.agreement import verdict_text

    # The newcomer's case: medians 1.2 % apart on samples with 66 % noise. The floor is
    # compared with the medians' difference, and the text says so; the noise comes after,
    # named as the noisier measurement's.
    text = verdict_text(0.012, 0.6632, False, 0.4)
    assert text == (
        "agrees: the medians differ by 1.20 %, under the 3 % floor; "
        "the noisier measurement's IQR/median is 66.32 %"
    )
    assert verdict_text(0.1, 0.02, True, 0.001).startswith(
        "DISAGREES: the medians differ by 10.00 %, over the 3 % floor, and the rank test's "
        "p = 0.001 < 0.01"
    )
    assert verdict_text(0.05, None, False, 0.2) == (
        "agrees: the medians differ by 5.00 %, over the 3 % floor, but the rank test's "
        "p = 0.2 >= 0.01"
    )


def test_best_s_confirmed_and_noisy_lines_quote_one_noise_figure() -> None:
    from tunefleet.text.render import confirmation_text, noise_text

    best = {
        "confirm_state": "done",
        "confirmed_median_s": 0.5,
        "confirmed_gflops": 2.0,
        "confirm_trial_id": 26,
        "confirm_worker_host": "node",
        "confirm_worker_id": 1,
        "worker_id": 1,
        "confirm_input_seed": 1,
        "spread": 0.012,
        "noise": 0.6632,  # the noisier of the two: here the search's own
        "measured_noise": 0.6632,
        "disagrees": False,
        "agreement_p": 0.4,
        "noisy": True,
    }
    confirmed, noisy = confirmation_text(best), noise_text(best)
    assert confirmed.endswith("the noisier measurement's IQR/median is 66.32 %"), confirmed
    # the re-measurement's trial number is labelled as such, not read as a search trial
    assert "(re-measured as trial 26, extra to the budget, on node," in confirmed
    assert noisy is not None
    assert noisy.startswith("noisy: the search measurement's IQR/median is 66.32 % "), noisy
