"""Policy losses, one small file each, chosen by `[learner.loss] type = ...`
(rl.learner.losses.base has the shared inputs)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rl.learner.losses.base import LossInputs, LossOutput
from rl.learner.losses.cispo import CISPO
from rl.learner.losses.dapo import DAPO
from rl.learner.losses.dr_grpo import DrGRPO
from rl.learner.losses.grpo import GRPO
from rl.learner.losses.gspo import GSPO
from rl.learner.losses.sft import SFT
from rl.schema import TAG, default_tag

Loss = Annotated[GRPO | DrGRPO | DAPO | GSPO | CISPO | SFT, Field(discriminator=TAG), default_tag(GRPO)]

__all__ = ["CISPO", "DAPO", "GRPO", "GSPO", "SFT", "DrGRPO", "Loss", "LossInputs", "LossOutput"]
