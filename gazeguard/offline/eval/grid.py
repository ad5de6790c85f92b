"""The evaluation grid: which mechanisms (parsed from text like ``dcfpa-64-dct``) and which ε.

Stream mechanisms privatize each recording the way the live service would (LPA, FPA, CFPA,
DCFPA); dataset-release mechanisms (David-John et al. 2022) privatize the whole table at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.registry import MECHANISMS, MechanismKind

#: The paper's ε grid, per feature per chunk.
PAPER_EPSILONS: tuple[float, ...] = (0.48, 2.4, 4.8, 24.0, 48.0)
#: The full grid: none; every registry mechanism (an untransformed one, LPA, in chunks of 32; a
#: whole-recording one, FPA, with dft and dct; the chunked ones, CFPA and DCFPA, in chunks of 32,
#: 64 and 128 with dft and dct); and the dataset releases of David-John et al.: k-same
#: k ∈ {2,4,8}, Marginals (k, γ) ∈ {2,4,8} × {2,4}, Exponential-DP over the ε grid.
FULL_MECHANISMS: tuple[str, ...] = (
    "none",
    *(
        spec
        for m, kind in MECHANISMS.items()
        for spec in (
            [f"{m}-{n}-{t}" for n in (32, 64, 128) for t in ("dft", "dct")]
            if kind.chunked and kind.transformed
            else [f"{m}-{t}" for t in ("dft", "dct")]
            if kind.transformed
            else [f"{m}-32"]
        )
    ),
    *(f"ksame-{k}" for k in (2, 4, 8)),
    *(f"marginals-{k}-{g}" for g in (2, 4) for k in (2, 4, 8)),
    "expdp",
)
QUICK_MECHANISMS: tuple[str, ...] = (
    "none",
    "lpa-32",
    "fpa-dft",
    "cfpa-32-dft",
    "dcfpa-32-dft",
    "dcfpa-32-dct",
    "ksame-4",
)
QUICK_EPSILONS: tuple[float, ...] = (0.48, 4.8, 48.0)


@dataclass(frozen=True)
class MechanismSpec:
    """One mechanism of the grid, parsed from text like ``dcfpa-64-dct``.

    Attributes:
        family: ``none``, ``lpa``, ``fpa``, ``cfpa``, ``dcfpa`` (stream mechanisms, per
            recording) or ``ksame``, ``marginals``, ``expdp`` (dataset releases, see
            :mod:`gazeguard.offline.eval.releases`).
        n: steps per chunk (LPA/CFPA/DCFPA); None for FPA (whole recording) and the rest.
        transform: ``dft`` or ``dct`` for FPA/CFPA/DCFPA, else None.
        k: group size (k-same) or plausible-deniability k (Marginals).
        gamma: plausible-deniability γ (Marginals).
    """

    family: str
    n: int | None = None
    transform: str | None = None
    k: int | None = None
    gamma: float | None = None

    @property
    def kind(self) -> MechanismKind | None:
        """The registry's stream mechanism (None for ``none`` and the dataset releases)."""
        return MECHANISMS.get(self.family)

    @property
    def whole(self) -> bool:
        """One release per whole recording (FPA), not chunk by chunk."""
        return self.kind is not None and not self.kind.online

    @property
    def is_release(self) -> bool:
        """A dataset-release mechanism (David-John et al.) rather than a stream mechanism."""
        return self.family in RELEASE_FAMILIES

    @property
    def key(self) -> str:
        """Canonical text form, e.g. ``dcfpa-64-dct``, ``ksame-4``, ``marginals-4-2``."""
        parts = [self.family]
        parts += [str(v) for v in (self.n, self.transform, self.k) if v is not None]
        if self.gamma is not None:
            parts.append(f"{self.gamma:g}")
        return "-".join(parts)

    @property
    def label(self) -> str:
        """Display form in the paper's style, e.g. ``DCFPA-64 (dct)``."""
        if self.family == "none":
            return "clean (no privacy)"
        if self.family == "ksame":
            return f"k-same-select (k={self.k})"
        if self.family == "marginals":
            return f"Marginals PD (k={self.k}, γ={self.gamma:g})"
        if self.family == "expdp":
            return "Exponential-DP (Steil)"
        text = self.family.upper() + (f"-{self.n}" if self.n is not None else "")
        return f"{text} ({self.transform})" if self.transform else text


#: Dataset-release families, evaluated by :mod:`gazeguard.offline.eval.releases`.
RELEASE_FAMILIES = ("ksame", "marginals", "expdp")
_SPEC = re.compile(rf"^(none|{'|'.join(MECHANISMS)})(?:-(\d+))?(?:-(dft|dct))?$")
_RELEASE_SPEC = re.compile(r"^(?:(ksame)-(\d+)|(marginals)-(\d+)-(\d+(?:\.\d+)?)|(expdp))$")


def parse_mechanism(text: str) -> MechanismSpec:
    """Parse ``none``, ``lpa[-N]``, ``fpa[-dft|-dct]``, ``cfpa-N[-dft|-dct]``, ``dcfpa-N[-…]``,
    ``ksame-K``, ``marginals-K-GAMMA`` or ``expdp``.

    Defaults: LPA chunks of 32 steps, transform ``dft``.

    Raises:
        ConfigError: field ``mechanisms``, quoting the text.
    """
    r = _RELEASE_SPEC.match(text.strip().lower())
    if r is not None:
        if r.group(1):
            return MechanismSpec("ksame", k=int(r.group(2)))
        if r.group(3):
            return MechanismSpec("marginals", k=int(r.group(4)), gamma=float(r.group(5)))
        return MechanismSpec("expdp")
    m = _SPEC.match(text.strip().lower())
    if m is None:
        raise ConfigError(
            "mechanisms",
            text,
            "expected none, lpa[-N], fpa[-dft|-dct], cfpa-N[-dft|-dct], dcfpa-N[-dft|-dct], "
            "ksame-K, marginals-K-GAMMA or expdp, e.g. dcfpa-64-dct",
            "argument",
        )
    family, n_text, transform = m.group(1), m.group(2), m.group(3)
    n = int(n_text) if n_text else None
    if family == "none":
        if n is not None or transform is not None:
            raise ConfigError(
                "mechanisms", text, "'none' takes no chunk size or transform", "argument"
            )
        return MechanismSpec("none")
    kind = MECHANISMS[family]
    if not kind.online:  # FPA
        if n is not None:
            raise ConfigError(
                "mechanisms",
                text,
                "FPA works on the whole recording; drop the chunk size",
                "argument",
            )
        return MechanismSpec(family, None, transform or "dft")
    if not kind.transformed:  # LPA
        if transform is not None:
            raise ConfigError("mechanisms", text, "LPA has no transform", "argument")
        n = n or 32
    elif n is None:
        raise ConfigError(
            "mechanisms", text, f"{family} needs a chunk size, e.g. {family}-64", "argument"
        )
    if n < 2 or n & (n - 1):
        raise ConfigError(
            "mechanisms", text, f"chunk size {n} is not a power of two >= 2", "argument"
        )
    return MechanismSpec(family, n, transform or "dft" if kind.transformed else None)
