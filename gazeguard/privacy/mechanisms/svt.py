"""The sparse vector technique: "has something changed?" asked privately, again and again.

:class:`AboveThreshold` (Dwork & Roth 2014, Algorithm 1, with discrete Laplace noise) answers a
stream of queries ``q_1, q_2, …`` — each a number in ``[−sensitivity/2, sensitivity/2]``
computed on one person's data — with "below" until the first query whose noisy value reaches a
noisy threshold, and then stops: a *round*. A whole round, however many "below" answers it
gives, is ε-DP: the threshold gets noise of scale ``2Δ/ε`` and each query ``4Δ/ε``
(``Δ`` the largest change of one query between neighbouring inputs: here any two values in
the query's range, so the bound holds for user-level neighbours that change every query).
After a round ends the next one needs a fresh threshold and its own ε.

Exactness: queries are put on the grid ``2^-GRID_BITS`` (rounding moves one by at most a grid
step, which is added to the sensitivity) and every comparison is between integers, with noise
from the exact discrete Laplace sampler
(:func:`gazeguard.privacy.mechanisms.exact.discrete_laplace`):
no floating-point noise, no sampler slack. The discrete Laplace has the same likelihood-ratio
bound on integer shifts as the continuous one, which is all the AboveThreshold proof uses.
"""

from __future__ import annotations

import math
from fractions import Fraction

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.exact import discrete_laplace
from gazeguard.privacy.mechanisms.randomness import RandomSource

__all__ = ["GRID_BITS", "AboveThreshold"]

#: Queries and the threshold are compared on a grid of 2^-GRID_BITS.
GRID_BITS = 20


def _on_grid(x: float) -> int:
    """``x`` in grid units, rounded to the nearest (ties away from zero)."""
    units = math.floor(abs(Fraction(x)) * (1 << GRID_BITS) + Fraction(1, 2))
    return units if x >= 0 else -units


class AboveThreshold:
    """One AboveThreshold round at a time (module docstring).

    Args:
        epsilon: ε of one round, > 0.
        sensitivity: ``Δ``, the range of a query (e.g. 2 for values in ``[−1, 1]``), > 0.
        threshold: the public threshold, in query units.
        source: random bytes (the OS CSPRNG in production).
    """

    def __init__(
        self, epsilon: float, sensitivity: float, threshold: float, source: RandomSource
    ) -> None:
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ConfigError("labels.epsilon_svt", epsilon, "must be finite and > 0")
        if not (math.isfinite(sensitivity) and sensitivity > 0):
            raise ConfigError("sensitivity", sensitivity, "must be finite and > 0")
        if not math.isfinite(threshold):
            raise ConfigError("labels.threshold", threshold, "must be finite")
        self.epsilon = float(epsilon)
        # a query on the grid moves by at most Δ plus one grid step (the rounding)
        delta_int = _on_grid(sensitivity) + 1
        eps = Fraction(epsilon)
        self._threshold_scale = 2 * delta_int / eps
        self._query_scale = 4 * delta_int / eps
        self._threshold = _on_grid(threshold)
        self._source = source
        self._noisy_threshold: int | None = None
        self.rounds = 0

    def start(self) -> None:
        """Begin a round: draw the noisy threshold (the round's ε is spent from here on)."""
        noise = discrete_laplace(self._threshold_scale, self._source)
        self._noisy_threshold = self._threshold + noise
        self.rounds += 1

    @property
    def active(self) -> bool:
        """Whether a round is under way (:meth:`start` called, no "above" answer yet)."""
        return self._noisy_threshold is not None

    def query(self, value: float) -> bool:
        """Whether ``value`` (noised) reaches the (noisy) threshold; ``True`` ends the round.

        Raises:
            RuntimeError: no round under way.
        """
        if self._noisy_threshold is None:
            msg = "AboveThreshold.query outside a round: call start() first"
            raise RuntimeError(msg)
        noisy = _on_grid(value) + discrete_laplace(self._query_scale, self._source)
        if noisy >= self._noisy_threshold:
            self._noisy_threshold = None
            return True
        return False
