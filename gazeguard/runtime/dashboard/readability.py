"""Whether a cohort figure's noise band lets a reader read it, and how many sessions it needs.

Every figure the dashboard shows carries a 95 % noise band, ``value ± 1.96·sd``, where ``sd`` is
the standard deviation of the privacy noise on that figure as the message states it (or derives
from ``sigma``). A band is only useful when it is narrow against the figure's **scale**. The page
calls a figure *readable* when the band's half-width ``1.96·sd`` is at most
:data:`READABLE_SHARE` (10 %) of its scale:

* **a feature mean**: the feature's public range ``hi − lo`` (the bounds each session's value is
  clipped to). The mean's sd is ``(hi − lo)·√F·σ/n`` at ``n`` contributing sessions
  (:meth:`gazeguard.plan.cohort.CohortPlan.mean_sd`), so the half-width over the range is
  ``1.96·√F·σ/n`` and a mean is readable from ``n ≥ 1.96·√F·σ/0.1`` sessions — the same for
  every feature of a message;
* **the session count**: the count itself. Its sd is ``σ`` (``σ·√C`` when the count is a
  ``C``-class histogram's total), so it is readable from ``n ≥ 1.96·sd/0.1`` sessions;
* **a class share** and **an AOI's dwell share**: the whole share scale, 0–100 %: the band is
  ``(noisy value ± 1.96·σ)/total`` with ``total`` about the number of sessions, so within ± 10
  percentage points from ``n ≥ 1.96·σ/0.1``;
* **the mode** (the group's dominant activity, permute-and-flip): the message states
  ``lead_for_90``, how many sessions' worth of score the true mode must lead every other class
  by to be named with probability ≥ 0.9. Held to the same 10 % rule — right 9 times in 10 when
  the leading activity holds 10 points more of the sessions than the next — it needs
  ``n ≥ lead_for_90/0.1`` sessions. The mode message carries no count (only the choice is
  released), so the page compares that with the same bucket's noisy count when the worker
  releases the means too, and otherwise says only what it needs;
* **the attention heatmap**: a cell's share is ``grid⁺/total`` of ``R·C`` cells; the map is
  readable when a cell's band is at most the share an even spread gives a cell, ``1/(R·C)``,
  i.e. from ``n ≥ 1.96·σ·R·C`` sessions (below that, noise alone can make an empty cell look
  like a typical one).

Everything here is computed from the message's own fields (``sigma``, the feature count, the
classes, the grid's shape, the noisy count): post-processing of released and public values,
so the page may show it without any further privacy cost. The sessions a figure needs are
those whose gaze contributes to one worker's bucket; a longer bucket (``cohort.bucket_s``)
lowers ``σ`` and so the sessions needed (the release plan's calibration), more features raise it
(``√F``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from gazeguard.wire.cohort import AttentionMessage, CohortMessage, ModeMessage

#: A figure is readable when its 95 % band's half-width is at most this share of its scale.
READABLE_SHARE: Final = 0.10
#: The 95 % two-sided normal quantile (the page's bands).
Z95: Final = 1.96


@dataclass(frozen=True)
class Readability:
    """One figure's readability.

    Attributes:
        readable: the 95 % band's half-width is within the figure's limit at this bucket's
            noisy count.
        half_width: that half-width as a share of the figure's scale (``inf`` at no sessions).
        limit: the largest half-width that is readable, as a share of the scale.
        sessions: the least number of contributing sessions at which the figure would be
            readable with this message's noise (``σ``).
        scale: what the half-width is measured against, in words.
    """

    readable: bool
    half_width: float
    limit: float
    sessions: int
    scale: str

    def to_json(self) -> dict[str, Any]:
        """The figure for the page (``half_width`` ``None`` when infinite: JSON has no ∞)."""
        return {
            "readable": self.readable,
            "half_width": self.half_width if math.isfinite(self.half_width) else None,
            "limit": self.limit,
            "sessions": self.sessions,
            "scale": self.scale,
        }


def sessions_needed(sd_at_one: float, limit: float = READABLE_SHARE) -> int:
    """The least ``n ≥ 1`` with ``1.96·sd_at_one/n ≤ limit``.

    Args:
        sd_at_one: the figure's noise sd at one session, as a share of its scale (``sd`` falls
            as ``1/n`` with ``n`` sessions).
        limit: the readable half-width, as a share of the scale.
    """
    need = Z95 * sd_at_one / limit
    n = max(1, math.ceil(need))
    # ceil of a product rounded up by one ulp would ask for a session too many
    return n - 1 if n > 1 and Z95 * sd_at_one / (n - 1) <= limit else n


def _judge(sd_at_one: float, sessions: float, scale: str, limit: float) -> Readability:
    half = Z95 * sd_at_one / sessions if sessions > 0 else math.inf
    return Readability(half <= limit, half, limit, sessions_needed(sd_at_one, limit), scale)


def count_sd(m: CohortMessage) -> float:
    """The noise sd of ``m.noisy_count``: ``σ``, or ``σ·√C`` when the count is the total of a
    ``C``-class histogram (a plan without features has no count coordinate)."""
    return m.sigma if m.features else m.sigma * math.sqrt(len(m.classes))


def aggregate_readability(m: CohortMessage) -> dict[str, Any]:
    """The readability of each figure of an aggregate, for the page.

    Returns:
        ``count``, ``means`` (``None`` without features) and ``shares`` (``None`` without
        classes), each :meth:`Readability.to_json`; the means' figure holds for every feature.
    """
    n = max(m.noisy_count, 0.0)
    out: dict[str, Any] = {
        "count": _judge(count_sd(m), n, "the count", READABLE_SHARE).to_json(),
        "means": None,
        "shares": None,
    }
    if m.features:
        # sd/(hi − lo) = √F·σ/count: the message's count is the means' denominator
        sd1 = math.sqrt(len(m.features)) * m.sigma
        out["means"] = _judge(sd1, m.count, "the public range", READABLE_SHARE).to_json()
    if m.classes:
        total = sum(max(h, 0.0) for h in m.noisy_histogram)
        out["shares"] = _judge(m.sigma, total, "100 % (the share scale)", READABLE_SHARE).to_json()
    return out


def attention_readability(m: AttentionMessage) -> dict[str, Any]:
    """The readability of an attention message's heatmap and AOI shares, for the page.

    Returns:
        ``heatmap`` (``None`` without a grid) and ``aois`` (``None`` without AOIs), each
        :meth:`Readability.to_json`.
    """
    out: dict[str, Any] = {"heatmap": None, "aois": None}
    if m.grid is not None and m.rows is not None and m.cols is not None:
        total = sum(max(v, 0.0) for row in m.grid for v in row)
        cells = m.rows * m.cols
        out["heatmap"] = _judge(
            m.sigma, total, f"an even spread's share of a cell (1/{cells})", 1.0 / cells
        ).to_json()
    if m.aois is not None:
        total = sum(max(a.noisy_dwell, 0.0) for a in m.aois)
        out["aois"] = _judge(m.sigma, total, "100 % (the share scale)", READABLE_SHARE).to_json()
    return out


def mode_readability(m: ModeMessage) -> dict[str, Any]:
    """What the mode needs to be read, for the page: ``sessions`` (the least number of sessions
    at which a 10-point lead is a lead of ``lead_for_90``), ``lead_for_90``, ``limit`` (the
    lead in shares, 0.1) and ``scale``. Whether a bucket reaches it needs that bucket's count,
    which the mode message does not carry (the page takes it from the aggregate, when there is
    one)."""
    return {
        "readable": None,
        "half_width": None,
        "limit": READABLE_SHARE,
        "sessions": max(1, math.ceil(m.lead_for_90 / READABLE_SHARE - 1e-9)),
        "lead_for_90": m.lead_for_90,
        "scale": "a 10-point lead of the leading activity",
    }
