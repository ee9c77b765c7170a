"""What one forward pass costs beyond its tokens, learned from the server's own passes.

The batcher cuts a batch by length only where the padding saved outweighs another pass. What a pass costs
beyond its tokens (Python, per-layer calls, the routing's gathers) does not shrink with more torch threads
while the per-token work does, so one calibrated figure is right for one machine, model and thread count
only. :class:`PassCost` fits ``seconds = overhead + per_token x padded tokens`` over the recent passes and
gives the overhead in tokens, starting from a prior until it has seen enough passes of different sizes.
"""

from __future__ import annotations

#: The overhead before any pass was seen, in tokens (all-MiniLM-L6-v2, one torch thread: docs/serving.md).
PRIOR_OVERHEAD_TOKENS = 32.0


class PassCost:
    """An exponentially weighted least-squares fit of pass time against padded tokens.

    ``decay`` sets how fast old passes are forgotten (0.99: about the last hundred count); the fit is used once
    ``min_passes`` passes were seen and their sizes differ (a spread of sizes below ``min_spread`` of their
    mean, or a slope that is not positive, keeps the last estimate). The estimate stays within
    ``[0, max_tokens]``."""

    def __init__(self, prior_tokens: float = PRIOR_OVERHEAD_TOKENS, decay: float = 0.99, min_passes: int = 20,
                 min_spread: float = 0.1, max_tokens: float = 4096.0):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1] (got {decay}).")
        self.decay = decay
        self.min_passes = min_passes
        self.min_spread = min_spread
        self.max_tokens = max_tokens
        self.overhead_tokens = float(prior_tokens)
        self.passes = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """One forward pass of ``tokens`` padded tokens (rows times the longest row) that took ``seconds``."""
        if tokens <= 0 or not seconds > 0.0:
            return
        d = self.decay
        self._w = d * self._w + 1.0
        self._x = d * self._x + tokens
        self._y = d * self._y + seconds
        self._xx = d * self._xx + tokens * tokens
        self._xy = d * self._xy + tokens * seconds
        self.passes += 1
        if self.passes >= self.min_passes:
            self._refit()

    def _refit(self) -> None:
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x <= (self.min_spread * mean_x) ** 2:
            return
        slope = (self._xy / self._w - mean_x * mean_y) / var_x
        if slope <= 0.0:
            return
        intercept = mean_y - slope * mean_x
        self.overhead_tokens = min(max(intercept / slope, 0.0), self.max_tokens)
