"""pass@k: the unbiased estimator of Chen et al. (2021), per task, and its
mean over tasks with a standard error.

    pass@k(n, c) = 1 - C(n - c, k) / C(n, k)      n samples, c of them pass

computed as a product, which stays exact for large n. The mean over tasks
has standard error std(per-task values, ddof=1) / sqrt(tasks): the spread
of tasks, which dominates at the sizes evaluated here (the sampling noise
within a task is not added).

Hand check: n = 5, c = 2: pass@1 = 2/5 = 0.4; pass@2 = 1 - C(3,2)/C(5,2)
= 1 - 3/10 = 0.7; pass@5 = 1 (some sample of five passes).
"""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} of {c} passing in {n} samples is not defined")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def clustered_se(values: list[float], clusters: list[str]) -> float:
    """The standard error of the mean of `values` when those of one cluster
    (tasks of one template) move together: the cluster-robust (sandwich)
    estimate, sqrt(G / (G - 1)) * sqrt(sum over clusters of their summed
    residuals squared) / n. Forty instances of five templates are closer to
    five observations than to forty; the per-task error would claim forty."""
    n, groups = len(values), set(clusters)
    if n == 0 or len(groups) < 2:
        return 0.0
    m = sum(values) / n
    sums: dict[str, float] = {}
    for v, c in zip(values, clusters, strict=True):
        sums[c] = sums.get(c, 0.0) + (v - m)
    g = len(groups)
    return math.sqrt(g / (g - 1)) * math.sqrt(sum(s * s for s in sums.values())) / n


def mean_and_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))
