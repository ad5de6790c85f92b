"""The one place that says what each mechanism is: name → kind, parameters, sensitivity, noise.

Every other module — configuration, messages, the pipeline, dataset release, evaluation and
``k="auto"`` — reads mechanisms from here instead of spelling out names or branching on them.

:data:`MECHANISMS` maps a name to a :class:`MechanismKind`:

============  ======================================  ========  =========  ==========
name          what is noised                          online    chunked    transform
============  ======================================  ========  =========  ==========
``lpa``       every value of the chunk (Laplace PA)   yes       no         identity
``fpa``       k lowest frequencies of a recording     no        no         dft / dct
``cfpa``      k lowest frequencies of each chunk      yes       yes        dft / dct
``dcfpa``     k lowest frequencies of the clipped     yes       yes        dft / dct
              difference chunk, then cumulative sum
============  ======================================  ========  =========  ==========

:data:`NOISE` maps a noise family to a :class:`NoiseKind` (``laplace``: pays the L1 sensitivity;
``gaussian``: pays the L2 sensitivity). A mechanism is a kind × a noise family; adding a kind or
a family means one entry here and its code in the module that computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting.loss import GaussianEvent, LaplaceEvent
from gazeguard.privacy.mechanisms.bounds import (
    is_power_of_two,
)

FloatArray = npt.NDArray[np.float64]
TransformName = Literal["dft", "dct"]
TransformOrIdentity = Literal["dft", "dct", "identity"]
TRANSFORMS: tuple[TransformName, ...] = ("dft", "dct")
#: Largest m whose exact (tight) sensitivity is computed: ≤ ~1 s once per configuration; above
#: it the exact dynamic programme grows to minutes and the loose bound is used.
TIGHT_MAX_M = 7


def kept_coefficients(transform: str, k: int) -> int:
    """``m``: real coefficients kept for ``k`` frequencies (``2k − 1`` for dft, ``k`` for dct)."""
    return 2 * k - 1 if transform == "dft" else k


def max_k(transform: str, n: int) -> int:
    """Largest admissible ``k``: ``n // 2`` for dft, ``n`` for dct."""
    return n // 2 if transform == "dft" else n


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """What one release of one feature may change between neighbouring inputs (per feature).

    Attributes:
        l1: float64 (F,) bound on ``‖c − c'‖₁`` of the noised coefficients (Laplace pays this).
        l2: float64 (F,) bound on ``‖c − c'‖₂`` of the noised coefficients (Gaussian pays this).
        signal_norm: float64 (F,) largest ``‖s‖₂`` of the transformed signal (for the public
            floating-point error bound of the transform).
    """

    l1: FloatArray
    l2: FloatArray
    signal_norm: FloatArray


@dataclass(frozen=True, slots=True)
class MechanismKind:
    """One mechanism: what it transforms and which parameters it takes.

    Attributes:
        name: registry key (``lpa``, ``fpa``, ``cfpa``, ``dcfpa``).
        summary: one line for ``--help`` and documentation.
        online: runs chunk by chunk in the live sidecar (FPA needs the whole recording).
        chunked: ``n`` must be a power of two.
        difference: transforms the clipped difference chunk and rebuilds with a cumulative sum.
        transformed: keeps the ``k`` lowest frequencies of an orthonormal transform; ``False``
            (LPA) noises every value (identity transform, no ``k``).
    """

    name: str
    summary: str
    online: bool
    chunked: bool
    difference: bool
    transformed: bool

    def transform_of(self, transform: str) -> TransformOrIdentity:
        """The transform actually used: ``identity`` for LPA, else ``transform`` (checked)."""
        if not self.transformed and transform in (*TRANSFORMS, "identity"):
            return "identity"
        if transform not in TRANSFORMS:
            raise ConfigError("transform", transform, f"must be one of {TRANSFORMS}")
        return "dft" if transform == "dft" else "dct"

    def check_n(self, n: object) -> int:
        """``n`` as an int, or ConfigError (a power of two for chunked kinds)."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 2:
            raise ConfigError("n", n, "must be an integer >= 2")
        if self.chunked and not is_power_of_two(int(n)):
            raise ConfigError("n", n, f"{self.name} needs a power of two (e.g. 32, 64, 128)")
        return int(n)

    def max_k(self, transform: str, n: int) -> int:
        """Largest admissible k (``n/2`` for dft, ``n`` for dct, ``n`` for LPA)."""
        return max_k(self.transform_of(transform), n) if self.transformed else n

    def check_k(self, k: object, transform: str, n: int) -> int:
        """An explicit ``k`` as an int within ``1..max_k``, or ConfigError (LPA: ``n``)."""
        if not self.transformed:
            return n
        top = self.max_k(transform, n)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= top:
            limit = "n/2" if transform == "dft" else "n"
            raise ConfigError(
                "k", k, f"must be 'auto' or an integer in 1..{top} ({limit}, {transform})"
            )
        return int(k)

    def kept(self, transform: str, k: int, n: int) -> int:
        """m, the real coefficients noised per feature per release."""
        return kept_coefficients(self.transform_of(transform), k) if self.transformed else n

    def carries(self, transform: str, k: int, n: int) -> str:
        """What a consumer receives per feature per release, in words."""
        if not self.transformed:
            return f"{n} values per feature per chunk, each with independent noise"
        m = self.kept(transform, k, n)
        what = "difference-chunk" if self.difference else "chunk"
        if self.difference and m == 1:
            return (
                "one number per feature per chunk (the chunk's net change from the feature's "
                f"public lower bound), drawn as a ramp of {n} values: only its end carries "
                "information"
            )
        if m == 1:
            return f"one value per feature per chunk (the chunk mean), repeated {n} times"
        return (
            f"{m} numbers per feature per {'recording' if not self.online else 'chunk'} "
            f"(the {k} lowest {transform} frequencies of the {what}), drawn as {n} values"
        )


@dataclass(frozen=True, slots=True)
class NoiseKind:
    """A noise family.

    Attributes:
        name: ``laplace`` or ``gaussian``.
        norm: which sensitivity it pays (``l1`` or ``l2``).
        summary: one line for ``--help``.
        event: the accounting event of one release of one feature (noise multiplier = noise
            scale / that sensitivity, sampler slack), as the accountant composes it.
    """

    name: str
    norm: Literal["l1", "l2"]
    summary: str
    event: type[LaplaceEvent] | type[GaussianEvent]


MECHANISMS: Mapping[str, MechanismKind] = MappingProxyType(
    {
        "lpa": MechanismKind(
            "lpa", "Laplace/Gaussian noise on every value of each chunk", True, False, False, False
        ),
        "fpa": MechanismKind(
            "fpa", "k lowest frequencies of a whole recording (offline only)", False, False, False,
            True,
        ),
        "cfpa": MechanismKind(
            "cfpa", "k lowest frequencies of each chunk", True, True, False, True
        ),
        "dcfpa": MechanismKind(
            "dcfpa",
            "k lowest frequencies of each clipped difference chunk, then cumulative sum",
            True,
            True,
            True,
            True,
        ),
    }
)  # fmt: skip
"""Every mechanism by name."""

ONLINE_MECHANISMS: tuple[str, ...] = tuple(k for k, v in MECHANISMS.items() if v.online)
"""Mechanisms the live sidecar can run chunk by chunk."""

NOISE: Mapping[str, NoiseKind] = MappingProxyType(
    {
        "laplace": NoiseKind(
            "laplace", "l1", "discrete Laplace: pure ε-DP, pays L1 sensitivity", LaplaceEvent
        ),
        "gaussian": NoiseKind(
            "gaussian", "l2", "discrete Gaussian: (ε, δ)-DP, pays L2 sensitivity", GaussianEvent
        ),
    }
)
"""Every noise family by name."""


def mechanism_kind(name: object, *, online: bool = False, field: str = "name") -> MechanismKind:
    """The kind called ``name``, or a ConfigError listing the choices.

    Args:
        name: the mechanism name.
        online: only accept mechanisms the live sidecar can run.
        field: the setting's name for the error message.
    """
    choices = ONLINE_MECHANISMS if online else tuple(MECHANISMS)
    kind = MECHANISMS.get(name) if isinstance(name, str) else None
    if kind is None or kind.name not in choices:
        extra = " (fpa works on whole recordings: use it offline)" if name == "fpa" else ""
        quoted = ", ".join(repr(c) for c in choices)
        raise ConfigError(field, name, f"must be one of {quoted}{extra}")
    return kind


def noise_kind(name: object, *, field: str = "noise") -> NoiseKind:
    """The noise family called ``name``, or a ConfigError listing the choices."""
    kind = NOISE.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ConfigError(field, name, f"must be one of {', '.join(repr(n) for n in NOISE)}")
    return kind
