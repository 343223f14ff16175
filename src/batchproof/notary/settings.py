"""What a report is computed with: the near-tie margin, the TIS caps and the MIS band, each
checked in range and finite (the report repeats them, and JSON holds no infinity)."""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    # Top-2 logprobs within this many nats: a tie any engine's rounding can flip (a greedy
    # token that differs there is explained by the tie, not by a bug).
    near_tie: float = 0.05
    # Truncated importance sampling caps (TIS: a ratio above C is cut to C). 2 is verl's
    # rollout_is_threshold default, 3 TRL's vllm_importance_sampling_cap.
    tis_caps: tuple[float, ...] = (2.0, 3.0)
    # Masked importance sampling (MIS) / rejection: tokens with a ratio outside [low, high] are dropped.
    mask_band: tuple[float, float] = (0.5, 2.0)
    # Routing replay (R3, docs/moe.md): a rollout that claims its MoE routing is scored under it
    # (its logprobs are then those of that routing); without it, scored under ours, and the two
    # routings compared.
    replay_routing: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.near_tie) and self.near_tie >= 0):
            raise SettingError("near_tie", f"near_tie must be a finite number >= 0, got {self.near_tie}")
        if not all(math.isfinite(c) and c > 0 for c in self.tis_caps):
            raise SettingError("tis_caps", f"TIS caps must be finite numbers > 0, got {self.tis_caps}")
        low, high = self.mask_band
        if not (math.isfinite(high) and 0 < low <= 1 <= high):
            raise SettingError("mask_band", f"the mask band must be finite and hold 1 (0 < low <= 1 <= high), "
                                            f"got {self.mask_band}")


class SettingError(ValueError):
    """A setting out of its range; `field` names it as the request spells it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
