"""Advantages: one number per sample, from the rewards of its group.

    group_relative(r, std=True)   (r - mean_g) / (std_g + eps)    GRPO
    group_relative(r, std=False)  r - mean_g                      Dr. GRPO
    leave_one_out(r)              r_i - mean_{j != i} r_j          RLOO

Hand check: rewards [1, 0, 0, 0] in one group: mean 0.25, std 0.433
(population), so GRPO gives [1.732, -0.577, -0.577, -0.577]; Dr. GRPO
[0.75, -0.25, -0.25, -0.25]; RLOO [1, -1/3, -1/3, -1/3]. A group whose
rewards are all equal gets 0 everywhere in each (no signal).
"""

from __future__ import annotations

import torch


def _by_group(values: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: the sum, the sum of squares and the size of its group."""
    _, inv = torch.unique(groups, return_inverse=True)
    n = torch.zeros(int(inv.max()) + 1, dtype=values.dtype).index_add_(0, inv, torch.ones_like(values))
    s = torch.zeros_like(n).index_add_(0, inv, values)
    s2 = torch.zeros_like(n).index_add_(0, inv, values * values)
    return s[inv], s2[inv], n[inv]


def group_relative(rewards: torch.Tensor, groups: torch.Tensor, std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    s, s2, n = _by_group(rewards.double(), groups)
    mean = s / n
    adv = rewards.double() - mean
    if std:
        var = (s2 / n - mean * mean).clamp(min=0.0)
        adv = adv / (var.sqrt() + eps)
    return adv.to(rewards.dtype)


def leave_one_out(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    s, _, n = _by_group(rewards.double(), groups)
    others = (s - rewards.double()) / (n - 1).clamp(min=1.0)
    adv = torch.where(n > 1, rewards.double() - others, torch.zeros_like(s))
    return adv.to(rewards.dtype)
