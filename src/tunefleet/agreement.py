"""How noisy a sample set is, and whether two measurements of one configuration agree.

Pure functions over timing samples (seconds), used by the worker (is a sample set too noisy
to stop timing?), by the coordinator's confirmation (does the re-measurement agree?) and,
through what the coordinator stores, by the ``confirmations`` view and ``tunefleet best``.

**Noise** is the inter-quartile range over the median (quartiles by linear interpolation,
which is what PostgreSQL's ``percentile_cont`` computes, so the views show the same figure).
The full range it replaces grows with the number of samples and with any one outlier: with
200 samples on a busy machine it was several hundred percent, and a check against it almost
could not fail. The IQR ignores the slowest and fastest quarter.

**Agreement** of two sample sets is decided by a two-sided Mann-Whitney rank test at
:data:`ALPHA` (exact for small sets, else the normal approximation with tie and continuity
corrections), behind a floor:
medians less than :data:`FLOOR` apart always agree. Under the null hypothesis (both sets
are independent draws from one distribution) the test calls a disagreement at most about
``ALPHA`` of the time; the floor only lowers that. Ranks make it indifferent to a few huge
outliers (a descheduled launch is one rank, however slow). The floor is the protocol's
resolution: samples within one measurement are not independent (clock boost, thermal state
and what else ran on the host drift over seconds), so with hundreds of samples the test
alone would call differences of a fraction of a percent between two processes significant,
which a user cannot act on. 3 % sits under the 10 % slowdown a confirmation must catch and
is the tolerance the GPU isolation benchmark holds the protocol to.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: False-alarm rate of the rank test (two-sided) for two re-measurements of one kernel.
ALPHA = 0.01
#: Relative difference of the medians under which two measurements always agree.
FLOOR = 0.03
#: A sample set whose IQR over median exceeds this is noisy: the worker keeps timing (within
#: the protocol's ``max_launches``) and flags it if it stays so. A quiet GPU's samples sit
#: well under 1 %; a CPU device that shares its cores with other work goes far above it.
NOISY = 0.05


def quantile(sorted_samples: Sequence[float], p: float) -> float:
    """The ``p`` quantile of ascending samples by linear interpolation (``percentile_cont``)."""
    if not sorted_samples:
        raise ValueError("no samples")
    pos = p * (len(sorted_samples) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (pos - lo) * (sorted_samples[hi] - sorted_samples[lo])


def median(samples: Sequence[float]) -> float:
    return quantile(sorted(samples), 0.5)


def noise(samples: Sequence[float]) -> float:
    """Inter-quartile range over the median of ``samples`` (0 for fewer than two)."""
    s = sorted(samples)
    if len(s) < 2:
        return 0.0
    mid = quantile(s, 0.5)
    if mid <= 0:
        return math.inf
    return (quantile(s, 0.75) - quantile(s, 0.25)) / mid


def is_noisy(samples: Sequence[float], limit: float = NOISY) -> bool:
    return noise(samples) > limit


#: Up to this many samples in all (and no ties) the rank test's p-value is exact: the normal
#: approximation is poor there, and at 5 + 5 samples it could never reach ALPHA at all.
EXACT_UP_TO = 40


@functools.lru_cache(maxsize=4096)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many orderings of ``m`` + ``n`` distinct samples give each U of the first ``m``
    (U = 0 .. m * n): U's exact distribution under the null hypothesis."""
    if m == 0 or n == 0:
        return (1,)
    out = [0] * (m * n + 1)
    # The largest sample is one of the m (it beats all n) or one of the n (it beats none).
    for u, c in enumerate(_u_counts(m - 1, n)):
        out[u + n] += c
    for u, c in enumerate(_u_counts(m, n - 1)):
        out[u] += c
    return tuple(out)


def _exact_p(u: float, m: int, n: int) -> float:
    counts = _u_counts(m, n)
    total = math.comb(m + n, m)
    k = round(u)
    low = sum(counts[: k + 1]) / total
    high = sum(counts[k:]) / total
    return min(1.0, 2 * min(low, high))


def rank_test(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test of ``a`` against ``b``: exact for small
    sets without ties, else the normal approximation (ties get their average rank and shrink
    the variance)."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("rank test needs samples on both sides")
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    n = n1 + n2
    rank_sum_a = 0.0
    tie_term = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        avg_rank = (i + j) / 2 + 1
        t = j - i + 1
        tie_term += t**3 - t
        rank_sum_a += avg_rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u = rank_sum_a - n1 * (n1 + 1) / 2
    if n <= EXACT_UP_TO and tie_term == 0:
        return _exact_p(u, n1, n2)
    mean = n1 * n2 / 2
    var = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0  # every sample equal: nothing tells the two apart
    z = (abs(u - mean) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


@dataclass(frozen=True)
class Agreement:
    """The verdict on two measurements of one configuration."""

    agrees: bool
    #: How far apart the medians are: (larger - smaller) / smaller.
    spread: float
    #: The rank test's p-value (1.0 when the floor decided without it).
    p_value: float
    #: The larger of the two sample sets' noise (IQR over median).
    noise: float

    def describe(self) -> str:
        if self.spread <= FLOOR:
            why = f"under the {100 * FLOOR:g} % floor"
        elif self.agrees:
            why = f"not significant at {ALPHA:g} (p = {self.p_value:.3g})"
        else:
            why = f"significant at {ALPHA:g} (p = {self.p_value:.2g})"
        return f"medians {100 * self.spread:.2f} % apart, {why}"


def compare(
    a: Sequence[float], b: Sequence[float], alpha: float = ALPHA, floor: float = FLOOR
) -> Agreement:
    """Do sample sets ``a`` and ``b`` measure the same time? See the module's text."""
    ma, mb = median(a), median(b)
    spread = (max(ma, mb) - min(ma, mb)) / min(ma, mb)
    worst = max(noise(a), noise(b))
    if spread <= floor:
        return Agreement(True, spread, 1.0, worst)
    p = rank_test(a, b)
    return Agreement(p >= alpha, spread, p, worst)


def verdict_text(
    spread: float,
    noise: float | None,
    disagrees: bool | None,
    p_value: float | None,
    same_source: bool | None = None,
) -> str:
    """How a stored verdict reads in ``tune``'s last line and ``tunefleet best``: the verdict
    first, then the figure it was decided on next to the threshold it was compared with (the
    medians' difference and the floor, the rank test's p and its level), then the noise of
    the noisier of the two measurements, named as such: a noise figure never stands where it
    could read as the one compared with the floor."""
    differ = f"the medians differ by {100 * spread:.2f} %"
    floor = f"{100 * FLOOR:g} % floor"
    p = "?" if p_value is None else f"{p_value:.2g}"
    if same_source is False:
        text = (
            "DISAGREES: the cold re-measurement generated other code than the search timed "
            f"({differ})"
        )
    elif disagrees is None:
        text = f"not judged yet: {differ}"
    elif spread <= FLOOR and not disagrees:
        text = f"agrees: {differ}, under the {floor}"
    elif disagrees:
        text = f"DISAGREES: {differ}, over the {floor}, and the rank test's p = {p} < {ALPHA:g}"
    else:
        text = f"agrees: {differ}, over the {floor}, but the rank test's p = {p} >= {ALPHA:g}"
    if noise is not None:
        text += f"; the noisier measurement's IQR/median is {100 * noise:.2f} %"
    return text
