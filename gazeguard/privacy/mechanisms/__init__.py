"""Differential-privacy mechanisms for feature chunks: LPA, FPA, CFPA and DCFPA.

>>> import numpy as np
>>> from gazeguard.privacy.mechanisms import Bounds, make_mechanism
>>> mech = make_mechanism("dcfpa", n=64, k=8, epsilon=1.0,
...                       bounds=Bounds(lo=0.0, hi=10.0, max_step=0.5), n_features=3)
>>> y = mech.release(np.full((3, 64), 4.0))
>>> y.shape, mech.kept_coefficients, mech.noise_scale.shape
((3, 64), 15, (3,))

Modules: ``bounds`` (public bounds, sensitivities), ``transforms`` (orthonormal DFT/DCT on pyFFTW
plans), ``randomness`` (the OS CSPRNG, or an insecure seeded generator for tests),
``discrete_laplace`` and ``discrete_gaussian`` (the integer noise samplers), ``calibration`` (the
power-of-two grid and the noise scale per family, from ε or a noise multiplier), ``fpa`` (the
mechanisms), ``prior`` and ``auto_k`` (choosing k from a public prior).
"""

from gazeguard.privacy.mechanisms.auto_k import choose_k, expected_mse
from gazeguard.privacy.mechanisms.bounds import (
    Bounds,
    difference_sensitivity_l2,
    raw_sensitivity_l2,
)
from gazeguard.privacy.mechanisms.discrete_laplace import DiscreteLaplace
from gazeguard.privacy.mechanisms.fpa import Mechanism, make_mechanism
from gazeguard.privacy.mechanisms.prior import (
    PriorSpectrum,
    default_prior,
    estimate_prior,
    model_prior,
)
from gazeguard.privacy.mechanisms.randomness import (
    InsecureSeededRandom,
    OsRandom,
    RandomSource,
    random_source,
)
from gazeguard.privacy.mechanisms.registry import (
    MECHANISMS,
    NOISE,
    ONLINE_MECHANISMS,
    TRANSFORMS,
    MechanismKind,
    NoiseKind,
    Sensitivity,
    mechanism_kind,
    noise_kind,
)
from gazeguard.privacy.mechanisms.transforms import forward, inverse, load_wisdom, save_wisdom

__all__ = [
    "MECHANISMS",
    "NOISE",
    "ONLINE_MECHANISMS",
    "TRANSFORMS",
    "Bounds",
    "DiscreteLaplace",
    "InsecureSeededRandom",
    "Mechanism",
    "MechanismKind",
    "NoiseKind",
    "OsRandom",
    "PriorSpectrum",
    "RandomSource",
    "Sensitivity",
    "choose_k",
    "default_prior",
    "difference_sensitivity_l2",
    "estimate_prior",
    "expected_mse",
    "forward",
    "inverse",
    "load_wisdom",
    "make_mechanism",
    "mechanism_kind",
    "model_prior",
    "noise_kind",
    "random_source",
    "raw_sensitivity_l2",
    "save_wisdom",
]
