"""Privacy losses and accounting events: the vocabulary the accountant composes.

:class:`PrivacyLoss` is a (measure, value) pair as in OpenDP: pure ``ε``, approximate ``(ε, δ)``
or zero-concentrated ``ρ`` (zCDP). It is validated once, here; code that receives a
:class:`PrivacyLoss` need not re-check bare floats.

An *accounting event* describes one release by the privacy-loss pair that dominates it. Events
are frozen and hashable: a ledger counts releases per event (``Mapping[Event, int]``) and the
accountant composes such multisets (:func:`gazeguard.privacy.accounting.compose`). Each event
serialises
to a small JSON dict (:meth:`~LaplaceEvent.to_dict`, :func:`event_from_dict`) so that a ledger can
store it with every charge and recompute the composition exactly after a restart.

Neighbouring inputs and units
    All events describe one release on *neighbouring inputs* as the mechanism defines them (for
    gazeguard: any two chunk vectors within the public bounds). A mechanism's sensitivity is the
    largest change of its exact output between neighbours: ``Δ1`` (L1) for Laplace, ``Δ2`` (L2)
    for Gaussian. The events are scale-free: they carry the *noise-to-sensitivity ratio*.

Multi-dimensional Laplace: the 1-D pair with shift ``Δ1`` dominates
    :class:`LaplaceEvent` stands for i.i.d. Laplace noise of scale ``λ = ratio·Δ1`` on ``m``
    coordinates whose exact values change by a vector ``v`` with ``‖v‖₁ ≤ Δ1``. We account it
    with the 1-D pair ``(Lap(0, λ), Lap(Δ1, λ))``. Claim: for every ``ε``,
    ``δ_v(ε) ≤ δ_{Δ1}(ε)``, where ``δ_v`` is the hockey-stick divergence of
    ``(⊗ Lap(0, λ), ⊗ Lap(v_i, λ))``. I found no reference stating this for the L1 case, so
    here is the proof (units of ``λ = 1``; ``tests/privacy/test_accounting_properties.py``
    checks the two-coordinate formula below against direct quadrature and the claim against
    dp-accounting's PLDs).

    1. Sign flips of coordinates and dropping coordinates with ``v_i = 0`` are bijections /
       identical factors, so assume ``v_i > 0``. ``δ_s(ε)`` of one pair with shift ``s`` is
       ``1 − e^{(ε−s)/2}`` for ``|ε| ≤ s``, ``1 − e^ε`` below ``−s`` and ``0`` above ``s``:
       non-decreasing in ``s``, so ``‖v‖₁ < Δ1`` only helps.
    2. Two coordinates, shifts ``a ≤ b``, ``s = a + b``. Under ``P = Lap(0)`` the privacy loss
       of shift ``c`` is ``c − 2T`` with ``T = clip(X, 0, c)``: an atom ½ at ``T = 0``, density
       ``e^{−t}/2`` on ``(0, c)`` and an atom ``e^{−c}/2`` at ``T = c``. Both the product pair
       and the single pair with shift ``s`` have loss ``s − 2U`` (``U = T_a + T_b``, resp.
       ``U = T_s``), so with ``w = (s − ε)/2``, ``δ(ε) = E[(1 − e^{2(U − w)})_+]``.
       Integrating ``T_a`` out of ``E[δ_b(·)]`` piecewise gives, for ``0 ≤ w ≤ s``,
       ``δ_{a,b}(ε) = 1 − e^{−w}·(1 + min(w, a, s − w)/2)`` while ``δ_s(ε) = 1 − e^{−w}``;
       for ``w ≥ s`` both equal ``1 − e^{ε}``, and both are 0 for ``w ≤ 0``. Hence
       ``δ_{a,b} ≤ δ_{a+b}`` for every ``ε``.
    3. ``m`` coordinates, by induction: a pointwise ordering of hockey-stick curves is the
       Blackwell ordering of the pairs (equivalently of their trade-off functions) and is
       preserved by taking products with a third pair (Dong, Roth & Su 2019, "Gaussian
       differential privacy", Lemma on ⊗ of trade-off functions). So
       ``⊗_{i≤m} Lap(v_i) ⪯ Lap(v_1 + … + v_{m−1}) ⊗ Lap(v_m) ⪯ Lap(‖v‖₁)``.
    The same ordering holds for Rényi divergences (any f-divergence respects Blackwell order),
    so the RDP fallback may use the 1-D pair too. Gaussian noise needs no such argument: the
    product pair with shift ``v`` is a rotation of the 1-D pair with shift ``‖v‖₂``.

Sampler slack (``slack``), composed honestly
    A real sampler is not exactly the ideal distribution. ``slack = s`` for a release means:
    for every input ``x`` and output ``o`` the implemented probability ``P'_x(o)`` and the ideal
    one ``P_x(o)`` satisfy ``ln(P'_x(o)/P_x(o)) ∈ [−b, a]`` with ``a, b ≥ 0`` and ``a + b ≤ s``.
    (gazeguard's discrete samplers bound the relative error of every probability by
    ``η = 2^-21`` and charge ``s = ln((1+η)/(1−η))`` per coordinate; then ``a = ln(1+η)``,
    ``b = −ln(1−η)``. A release of ``m`` independent coordinates has ``s = m·s_coord``; chained
    approximations, e.g. :func:`discrete_laplace_slack`, add.) Two consequences per release:
    (i) the privacy loss ``ln(P'_x/P'_x')`` differs from the ideal one by at most ``a + b ≤ s``
    at every output; (ii) ``P'_x ≤ e^{a} P_x ≤ e^{s} P_x`` pointwise. For an (adaptive)
    composition of releases with total slack ``S = Σ count·slack`` both multiply along the
    product of conditional densities, so::

        δ_real(ε) = E_{P'}[(1 − e^{ε − L'})_+] ≤ E_{P'}[(1 − e^{ε − S − L})_+]
                  ≤ e^{S} · E_{P}[(1 − e^{(ε − S) − L})_+] = e^{S} · δ_ideal(ε − S),

    i.e. ``ε_real(δ) ≤ ε_ideal(δ·e^{−S}) + S``, and pure ``ε`` grows by ``S``. Adding ``S`` to
    ``ε`` alone is *not* enough: the two-point pair ``P = (p, 1−p)``, ``Q = (q, 1−q)`` with
    ``P'(first) = (1+η)p`` and ``Q'(first) = (1−η)q`` attains
    ``δ_real(ε) = (1+η)·δ_ideal(ε − s)`` exactly; the factor on ``δ`` is real (it is ``≈ 1.01``
    for an hour of 48 features at ``s ≈ 1e-6``, and the accountant applies it). Slack does not
    preserve zCDP (the ``a/(α−1)`` term in the Rényi bound diverges as ``α → 1``), so a
    :class:`GaussianEvent` with ``slack > 0`` has no ``ρ``; a Laplace event keeps the ``ρ`` of its
    pure ``ε`` (``ε``-DP implies ``ε²/2``-zCDP for any mechanism, Bun & Steinke 2016, Prop. 1.4).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

from gazeguard.core.errors import ConfigError

__all__ = [
    "Event",
    "GaussianEvent",
    "LaplaceEvent",
    "Measure",
    "PrivacyLoss",
    "PureEvent",
    "RandomizedResponseEvent",
    "discrete_laplace_slack",
    "event_from_dict",
]


class Measure(enum.StrEnum):
    """Which privacy measure a :class:`PrivacyLoss` is expressed in."""

    PURE = "pure"  #: ε-differential privacy
    APPROX = "approx"  #: (ε, δ)-differential privacy
    ZCDP = "zcdp"  #: ρ-zero-concentrated differential privacy (Bun & Steinke 2016)


def _positive(field: str, value: object, what: str) -> float:
    """``value`` as a finite float > 0, else a ConfigError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, value, f"{what} must be a number")
    v = float(value)
    if not (math.isfinite(v) and v > 0.0):
        raise ConfigError(field, value, f"{what} must be finite and > 0")
    return v


def _delta(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, value, "δ must be a number in [0, 1), e.g. 1e-6")
    v = float(value)
    if not (0.0 <= v < 1.0):  # also rejects NaN
        raise ConfigError(field, value, "δ must be in [0, 1), e.g. 1e-6")
    return v


def _slack(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, value, "slack must be a number >= 0 (ε per release)")
    v = float(value)
    if not (math.isfinite(v) and v >= 0.0):
        raise ConfigError(field, value, "slack must be finite and >= 0 (ε per release)")
    return v + 0.0  # -0.0 -> 0.0: one key per value


@dataclass(frozen=True, slots=True)
class PrivacyLoss:
    """A privacy loss in one measure; build with :meth:`pure`, :meth:`approx` or :meth:`zcdp`.

    Attributes:
        measure: :class:`Measure`.
        epsilon: ε (pure and approx), finite and > 0; ``None`` for zCDP.
        delta: δ in [0, 1) (approx; 0 for pure); ``None`` for zCDP.
        rho: ρ, finite and > 0 (zCDP); ``None`` otherwise.
    """

    measure: Measure
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None

    def __post_init__(self) -> None:
        m = Measure(self.measure)
        if m is Measure.ZCDP:
            ok = self.epsilon is None and self.delta is None and self.rho is not None
            if ok:
                object.__setattr__(self, "rho", _positive("rho", self.rho, "ρ"))
        else:
            ok = self.rho is None and self.epsilon is not None
            if ok:
                object.__setattr__(self, "epsilon", _positive("epsilon", self.epsilon, "ε"))
                d = 0.0 if self.delta is None else _delta("delta", self.delta)
                if m is Measure.PURE and d != 0.0:
                    raise ConfigError("delta", self.delta, "a pure ε loss has δ = 0")
                object.__setattr__(self, "delta", d)
        if not ok:
            raise ConfigError(
                "measure",
                str(m),
                "pure/approx need epsilon (and delta), zcdp needs rho only; "
                "use PrivacyLoss.pure(), .approx() or .zcdp()",
            )
        object.__setattr__(self, "measure", m)

    @classmethod
    def pure(cls, epsilon: float, *, field: str = "epsilon") -> PrivacyLoss:
        """Pure ε-DP. ``field`` names the setting in error messages."""
        return cls(Measure.PURE, _positive(field, epsilon, "ε"), 0.0)

    @classmethod
    def approx(
        cls, epsilon: float, delta: float, *, field: str = "epsilon", delta_field: str = "delta"
    ) -> PrivacyLoss:
        """(ε, δ)-DP. ``field``/``delta_field`` name the settings in error messages."""
        return cls(Measure.APPROX, _positive(field, epsilon, "ε"), _delta(delta_field, delta))

    @classmethod
    def zcdp(cls, rho: float, *, field: str = "rho") -> PrivacyLoss:
        """ρ-zCDP. ``field`` names the setting in error messages."""
        return cls(Measure.ZCDP, rho=_positive(field, rho, "ρ"))

    def __str__(self) -> str:
        if self.measure is Measure.ZCDP:
            return f"ρ={self.rho:.6g} (zCDP)"
        if self.measure is Measure.PURE:
            return f"ε={self.epsilon:.6g} (pure)"
        return f"ε={self.epsilon:.6g} at δ={self.delta:.6g}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``{"measure": ..., "epsilon"/"delta"/"rho": ...}``)."""
        if self.measure is Measure.ZCDP:
            return {"measure": str(self.measure), "rho": self.rho}
        return {"measure": str(self.measure), "epsilon": self.epsilon, "delta": self.delta}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLoss:
        """Inverse of :meth:`to_dict` (validates)."""
        measure = data.get("measure")
        if measure not in {m.value for m in Measure}:
            raise ConfigError("measure", measure, "must be one of 'pure', 'approx', 'zcdp'")
        return cls(Measure(measure), data.get("epsilon"), data.get("delta"), data.get("rho"))


# ----------------------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class LaplaceEvent:
    """One release of the (multi-dimensional) Laplace mechanism.

    Noise of scale ``λ = ratio·Δ1`` i.i.d. on every coordinate, ``Δ1`` the L1 sensitivity of the
    exact coordinates (module docstring: the 1-D pair with shift ``Δ1`` dominates). Pure
    ``ε = 1/ratio + slack``.

    Attributes:
        ratio: ``λ/Δ1``, finite and > 0.
        slack: additive per-release ε for the sampler's bounded inexactness (module docstring),
            finite and >= 0; e.g. ``m·SAMPLER_LOSS_PER_COORDINATE`` for ``m`` coordinates.
    """

    kind: ClassVar[Literal["laplace"]] = "laplace"
    ratio: float
    slack: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "ratio", _positive("LaplaceEvent.ratio", self.ratio, "ratio"))
        object.__setattr__(self, "slack", _slack("LaplaceEvent.slack", self.slack))

    @property
    def ideal_epsilon(self) -> float:
        """Pure ε of the ideal mechanism (without slack): ``1/ratio``."""
        return 1.0 / self.ratio

    @property
    def pure_epsilon(self) -> float:
        """Pure ε of one release: ``1/ratio + slack``."""
        return 1.0 / self.ratio + self.slack

    @property
    def rho(self) -> float:
        """zCDP ρ implied by the pure ε: ``ε²/2``."""
        return self.pure_epsilon**2 / 2.0

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "laplace", "ratio": r, "slack": s}``."""
        return {"kind": self.kind, "ratio": self.ratio, "slack": self.slack}

    def __str__(self) -> str:
        s = f", slack={self.slack:.3g}" if self.slack else ""
        return f"Laplace(λ/Δ1={self.ratio:.6g}{s})"


@dataclass(frozen=True, slots=True)
class GaussianEvent:
    """One release of the (multi-dimensional) Gaussian mechanism.

    Noise ``N(0, σ²)`` i.i.d. on every coordinate with ``σ = ratio·Δ2``, ``Δ2`` the L2
    sensitivity. ``ρ = 1/(2·ratio²)``-zCDP (exactly, for ``slack = 0``); no finite pure ε.

    Attributes:
        ratio: ``σ/Δ2``, finite and > 0.
        slack: as for :class:`LaplaceEvent`; with ``slack > 0`` the event has no ρ.
    """

    kind: ClassVar[Literal["gaussian"]] = "gaussian"
    ratio: float
    slack: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "ratio", _positive("GaussianEvent.ratio", self.ratio, "ratio"))
        object.__setattr__(self, "slack", _slack("GaussianEvent.slack", self.slack))

    @property
    def ideal_epsilon(self) -> float:
        """Always ``inf``."""
        return math.inf

    @property
    def pure_epsilon(self) -> float:
        """Always ``inf``: the Gaussian mechanism is not pure-DP."""
        return math.inf

    @property
    def rho(self) -> float | None:
        """``1/(2·ratio²)``; ``None`` when ``slack > 0`` (slack does not preserve zCDP)."""
        return None if self.slack else 0.5 / self.ratio**2

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "gaussian", "ratio": r, "slack": s}``."""
        return {"kind": self.kind, "ratio": self.ratio, "slack": self.slack}

    def __str__(self) -> str:
        s = f", slack={self.slack:.3g}" if self.slack else ""
        return f"Gaussian(σ/Δ2={self.ratio:.6g}{s})"


class _PureEpsilonEvent:
    """What an event stated by its pure ε alone reports: that ε (with or without slack, which
    is 0: any inexactness is folded into ε) and ``ρ = ε²/2``."""

    __slots__ = ()
    epsilon: float

    @property
    def ideal_epsilon(self) -> float:
        """ε."""
        return self.epsilon

    @property
    def pure_epsilon(self) -> float:
        """ε."""
        return self.epsilon

    @property
    def rho(self) -> float:
        """``ε²/2``."""
        return self.epsilon**2 / 2.0

    @property
    def slack(self) -> float:
        """Always 0 (fold any inexactness into ε)."""
        return 0.0


@dataclass(frozen=True, slots=True)
class RandomizedResponseEvent(_PureEpsilonEvent):
    """One release of k-ary randomized response with parameter ε (exact PLD).

    Reports the true class with probability ``e^ε/(e^ε + k − 1)`` and each other class with
    ``1/(e^ε + k − 1)``; neighbours are any two true classes. Pure ε; ``ρ = ε²/2``.

    Attributes:
        epsilon: finite and > 0.
        classes: ``k``, an integer >= 2.
    """

    kind: ClassVar[Literal["randomized_response"]] = "randomized_response"
    epsilon: float
    classes: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "epsilon", _positive("RandomizedResponseEvent.epsilon", self.epsilon, "ε")
        )
        k = self.classes
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ConfigError(
                "RandomizedResponseEvent.classes", k, "must be an integer >= 2 (number of labels)"
            )

    @property
    def noise_parameter(self) -> float:
        """dp-accounting's ``p`` (probability of a uniformly random report): ``k/(e^ε+k−1)``."""
        x = math.exp(-self.epsilon)  # no overflow for large ε
        return self.classes * x / (1.0 + (self.classes - 1) * x)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "randomized_response", "epsilon": ε, "classes": k}``."""
        return {"kind": self.kind, "epsilon": self.epsilon, "classes": self.classes}

    def __str__(self) -> str:
        return f"RandomizedResponse(ε={self.epsilon:.6g}, k={self.classes})"


@dataclass(frozen=True, slots=True)
class PureEvent(_PureEpsilonEvent):
    """Any ε-DP release, accounted by the canonical dominating pair of ε-DP.

    That pair is binary randomized response with parameter ε (Kairouz, Oh & Viswanath 2015:
    every ε-DP mechanism is a post-processing of it), so composition is exact for the worst case.

    Attributes:
        epsilon: finite and > 0.
    """

    kind: ClassVar[Literal["pure"]] = "pure"
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _positive("PureEvent.epsilon", self.epsilon, "ε"))

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "pure", "epsilon": ε}``."""
        return {"kind": self.kind, "epsilon": self.epsilon}

    def __str__(self) -> str:
        return f"Pure(ε={self.epsilon:.6g})"


#: Any accounting event.
Event: TypeAlias = LaplaceEvent | GaussianEvent | RandomizedResponseEvent | PureEvent

_KINDS: dict[str, tuple[type[Any], tuple[str, ...], tuple[str, ...]]] = {
    # kind: (class, required keys, optional keys)
    "laplace": (LaplaceEvent, ("ratio",), ("slack",)),
    "gaussian": (GaussianEvent, ("ratio",), ("slack",)),
    "randomized_response": (RandomizedResponseEvent, ("epsilon", "classes"), ()),
    "pure": (PureEvent, ("epsilon",), ()),
}


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from its :meth:`to_dict` form (validates; unknown keys are errors).

    Raises:
        ConfigError: unknown ``kind``, missing or unexpected keys, or invalid values.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("event", data, "must be a dict like {'kind': 'laplace', 'ratio': 56.0}")
    kind = data.get("kind")
    if kind not in _KINDS:
        raise ConfigError("event.kind", kind, f"must be one of {sorted(_KINDS)}")
    cls, required, optional = _KINDS[kind]
    keys = set(data) - {"kind"}
    missing = [k for k in required if k not in keys]
    extra = sorted(keys - set(required) - set(optional))
    if missing or extra:
        raise ConfigError(
            f"event[{kind!r}]", dict(data), f"missing keys {missing}, unexpected keys {extra}"
        )
    event: Event = cls(**{k: data[k] for k in keys})
    return event


def discrete_laplace_slack(t: float) -> float:
    """Slack of one discrete-Laplace coordinate against the continuous Laplace pair, per coordinate.

    The discrete Laplace with parameter ``t`` (``P(z) ∝ e^{−|z|/t}`` on the integers; noise
    scale ``λ = t·γ`` on a grid ``γ``) is *not* exactly a post-processing of the continuous
    Laplace pair that :class:`LaplaceEvent` accounts, but it is within a bounded factor of one:
    rounding ``X ~ Lap(0, t)`` to the nearest integer, a post-processing that commutes with the
    integer shifts of the released grid values, has pmf ``1 − e^{−h}`` at 0 and
    ``e^{−|z|/t}·sinh(h)`` elsewhere (``h = 1/(2t)``), while the discrete Laplace has
    ``tanh(h)·e^{−|z|/t}``. The ratio is ``tanh(h)/(1 − e^{−h}) ≥ 1`` at 0 and ``1/cosh(h) ≤ 1``
    elsewhere, so in the slack model of this module ``a = ln(tanh h/(1 − e^{−h}))`` and
    ``b = ln cosh h``; the slack is ``a + b ≈ 1/(4t)`` (2.4e-7 at ``t = 2^20``). A release of
    ``m`` discrete-Laplace coordinates drawn by a sampler with its own slack ``s_c`` per
    coordinate has ``slack = m·(s_c + discrete_laplace_slack(t))``.

    Args:
        t: the discrete Laplace parameter (noise scale in grid units), finite and > 0.
    """
    t = _positive("t", t, "the discrete Laplace parameter")
    h = 0.5 / t
    a = math.log(math.tanh(h)) - math.log(-math.expm1(-h))
    b = math.log(math.cosh(h))
    return (a + b) * (1.0 + 1e-9)  # a relative margin far above the logs' rounding error
