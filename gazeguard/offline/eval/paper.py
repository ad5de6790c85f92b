"""Reproduction mode: CFPA/DCFPA with the paper's data-dependent sensitivity (NOT private).

Bozkir et al. 2021 (eq. 7) set each feature's sensitivity from the data being released: the
largest distance between two participants' observation vectors,

    Δ2_f = max over participants p ≠ q of ‖X^(p,f) − X^(q,f)‖₂,

per chunk for the chunk-based methods, on the difference chunks ``[x₁, x₂ − x₁, …]`` for DCFPA,
and they choose k per chunk and per feature as the one with the smallest error over 100 noisy
releases of that very chunk ("optimal k values"). gazeguard never does either in production — a
sensitivity or a k read off the data leaks the data and voids the ε — but the evaluation can,
to answer one question: does gazeguard's DCFPA reproduce the paper's results *under the paper's
assumptions*, so that the gap between them and the honest results is those two choices?

Implementation: the production mechanism runs with the public bounds (same clipping, same
secure noise) at the per-feature ε that gives the paper's noise scale ``λ = √m·Δ2_paper/ε``:
``ε_f' = ε · Δ1_public,f / (√m·Δ2_paper,f)``, where Δ1_public is the L1 sensitivity the
production mechanism pays for its ``m`` kept coefficients (exact for small ``m``, at most
``√m·Δ2_public``). Here Δ2_paper is the maximum of
eq. 7 over every chunk position of the service's chunking (chunk c of every recording; pairs of
recordings of different people). k is the paper's oracle: for each chunk and feature, the k
with the smallest mean squared error over ``ORACLE_REPS`` noisy releases of that chunk at every
admissible k (chosen once per chunk and cached, as the paper chose k once, then evaluated). Rows
report the nominal ε, and the run's metadata and tables say that it is not differential privacy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.offline.eval.grid import MechanismSpec
from gazeguard.offline.eval.harness import FeatureBounds, MechanismFactory, Releaser
from gazeguard.privacy.mechanisms.registry import MECHANISMS
from gazeguard.signal.dataset import FeatureTable

if TYPE_CHECKING:
    from gazeguard.privacy.mechanisms import Bounds

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]

#: Families the paper's sensitivity is implemented for (its chunk-based contributions: the
#: registry's chunked, transformed mechanisms, CFPA and DCFPA).
PAPER_FAMILIES = tuple(m for m, kind in MECHANISMS.items() if kind.chunked and kind.transformed)

#: Noisy releases per candidate k when choosing the oracle k of a chunk (the paper: 100).
ORACLE_REPS = 10

#: Shown wherever results of this mode appear.
NOT_PRIVATE = (
    "paper sensitivity (Bozkir et al. eq. 7) and per-chunk oracle k, both read off the released "
    "data: NOT differentially private; for reproducing the paper only"
)


def paper_sensitivity(
    table: FeatureTable, cols: IntArray, n: int, *, difference: bool
) -> FloatArray:
    """Eq. 7 of Bozkir et al. per feature: the largest L2 distance, over chunk positions and
    over pairs of recordings of different people, between their chunks of ``n`` steps.

    Args:
        table: the feature table being released.
        cols: (F,) released feature columns.
        n: chunk length, steps (chunks start at each recording's first row; the tail is dropped).
        difference: use difference chunks ``[x₁, x₂ − x₁, …, x_n − x_{n−1}]`` (DCFPA).

    Returns:
        float64 (F,), Δ2 in feature units; 0 where no two people have a chunk in common.
    """
    by_position: dict[int, list[tuple[str, FloatArray]]] = {}
    for _, rows in table.recordings():
        x = table.X[np.ix_(rows, cols)]  # (T, F)
        person = str(table.person[rows[0]])
        for c in range(len(rows) // n):
            chunk = x[c * n : (c + 1) * n].T  # (F, n)
            if difference:
                chunk = np.concatenate([chunk[:, :1], np.diff(chunk, axis=1)], axis=1)
            by_position.setdefault(c, []).append((person, chunk))
    best = np.zeros(cols.size)
    for items in by_position.values():
        people = np.array([p for p, _ in items])
        a = np.stack([c for _, c in items])  # (R, F, n)
        other = people[:, None] != people[None, :]  # (R, R)
        if not other.any():
            continue
        for f in range(cols.size):
            v = a[:, f, :]  # (R, n)
            sq = np.einsum("rn,rn->r", v, v)
            d2 = sq[:, None] + sq[None, :] - 2.0 * (v @ v.T)
            best[f] = max(best[f], float(np.max(d2[other])))
    return np.sqrt(np.maximum(best, 0.0))


class OracleK:
    """A CFPA/DCFPA whose k is chosen per chunk and per feature from the chunk itself (the
    paper's "optimal k"): NOT private; evaluation only.

    Args:
        mechanisms: one production mechanism per candidate k (same family, n, ε, bounds).
        reps: noisy releases per candidate when choosing.
    """

    def __init__(self, mechanisms: dict[int, Releaser], reps: int = ORACLE_REPS) -> None:
        self.mechanisms = mechanisms
        self.reps = reps
        self._chosen: dict[bytes, IntArray] = {}

    def choose(self, x: FloatArray) -> IntArray:
        """(F,) oracle k of chunk ``x`` (F, n): least mean squared error over ``reps`` releases."""
        key = x.tobytes()
        if key not in self._chosen:
            ks = sorted(self.mechanisms)
            err = np.empty((len(ks), x.shape[0]))
            for i, k in enumerate(ks):
                mech = self.mechanisms[k]
                err[i] = np.mean(
                    [np.sum((mech.release(x) - x) ** 2, axis=1) for _ in range(self.reps)], axis=0
                )
            self._chosen[key] = np.asarray(ks, np.intp)[np.argmin(err, axis=0)]
        return self._chosen[key]

    def release(self, x: FloatArray) -> FloatArray:
        """Release ``x`` (F, n), each feature at its oracle k (fresh noise)."""
        best = self.choose(x)
        out = np.empty_like(x)
        for k in np.unique(best):
            rows = best == k
            out[rows] = self.mechanisms[int(k)].release(x)[rows]
        return out


class PaperFactory:
    """Production CFPA/DCFPA at the ε that gives the paper's noise scale, with the paper's
    oracle k (see the module doc). ``k`` is ignored unless an integer (then fixed, no oracle).

    Other families raise :class:`~gazeguard.core.errors.ConfigError` (the row is skipped). A
    picklable :data:`~gazeguard.offline.eval.harness.MechanismFactory` (worker processes are fresh).
    """

    def __init__(
        self, table: FeatureTable, cols: IntArray, bounds: FeatureBounds, k: int | str
    ) -> None:
        self.table, self.cols, self.bounds, self.k = table, cols, bounds, k
        self._ratios: dict[tuple[str, int, int, str], FloatArray] = {}
        self._eq7: dict[tuple[str, int], FloatArray] = {}

    def _bounds(self) -> Bounds:
        from gazeguard.privacy.mechanisms import Bounds  # noqa: PLC0415 - heavy import

        b = self.bounds
        return Bounds(lo=b.lo, hi=b.hi, max_step=b.max_step)

    def paper(self, family: str, n: int) -> FloatArray:
        """Δ2_paper per feature (cached per family and n)."""
        if (family, n) not in self._eq7:
            self._eq7[family, n] = paper_sensitivity(
                self.table, self.cols, n, difference=MECHANISMS[family].difference
            )
        return self._eq7[family, n]

    def ratio(self, family: str, n: int, kk: int, transform: str) -> FloatArray:
        """Δ1_public / (√m·Δ2_paper) per feature (cached per family, n, k and transform)."""
        from gazeguard.privacy.mechanisms import make_mechanism  # noqa: PLC0415 - heavy import
        from gazeguard.privacy.mechanisms.registry import kept_coefficients  # noqa: PLC0415

        key = (family, n, kk, transform)
        if key not in self._ratios:
            probe = make_mechanism(
                family, n=n, k=kk, epsilon=1.0, bounds=self._bounds(), transform=transform
            )
            public = probe.sensitivity
            scale = np.sqrt(kept_coefficients(transform, kk)) * self.paper(family, n)
            # A feature no two people differ in gets the smallest noise the grid allows.
            self._ratios[key] = public / np.maximum(scale, public * 1e-6)
        return self._ratios[key]

    def __call__(self, spec: MechanismSpec, n: int, epsilon: float, seed: int | None) -> Releaser:
        from gazeguard.privacy.mechanisms import make_mechanism  # noqa: PLC0415 - heavy import
        from gazeguard.privacy.mechanisms.registry import max_k  # noqa: PLC0415

        if spec.family not in PAPER_FAMILIES:
            msg = f"the paper's sensitivity is implemented for {', '.join(PAPER_FAMILIES)} only"
            raise ConfigError("sensitivity", "paper", msg, "argument")
        transform = spec.transform or "dft"
        kw: dict[str, Any] = {"n": n, "bounds": self._bounds(), "transform": transform}

        def build(kk: int, s: int | None) -> Releaser:
            eps = epsilon * self.ratio(spec.family, n, kk, transform)
            return make_mechanism(spec.family, epsilon=eps, k=kk, seed=s, **kw)

        if isinstance(self.k, int):
            return build(self.k, seed)
        candidates = range(1, max_k(transform, n) + 1)
        return OracleK({kk: build(kk, None if seed is None else seed + kk) for kk in candidates})


def paper_factory(
    table: FeatureTable, cols: IntArray, bounds: FeatureBounds, k: int | str
) -> MechanismFactory:
    """:class:`PaperFactory` (the paper's noise scale; not a privacy guarantee)."""
    return PaperFactory(table, cols, bounds, k)
