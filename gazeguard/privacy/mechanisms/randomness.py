"""Where the noise's random bytes come from: the operating system's CSPRNG, or an explicitly
insecure seeded generator for tests.

:class:`OsRandom` reads ``os.urandom`` (the kernel CSPRNG, ``getrandom(2)``); it is the default
and the only choice for production. A reproducible generator exists only as
:class:`InsecureSeededRandom`, selected by an explicit ``seed`` (:func:`random_source`); it is for
tests and experiments and must never serve a real user. The samplers
(:mod:`~gazeguard.privacy.mechanisms.discrete_laplace`,
:mod:`~gazeguard.privacy.mechanisms.discrete_gaussian`) take any :class:`RandomSource`.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from gazeguard.core.errors import ConfigError


class RandomSource(Protocol):
    """Where random bytes come from."""

    @property
    def secure(self) -> bool:
        """True only for a cryptographically secure, unpredictable source."""
        ...

    def bytes(self, n: int) -> bytes:
        """``n`` uniformly random bytes."""
        ...


class OsRandom:
    """The operating system's CSPRNG (``os.urandom``): the default, and the only choice for
    production."""

    @property
    def secure(self) -> bool:
        """Always True."""
        return True

    def bytes(self, n: int) -> bytes:
        """``n`` bytes from ``os.urandom``."""
        return os.urandom(n)


class InsecureSeededRandom:
    """INSECURE reproducible bytes from numpy's PCG64 seeded with ``seed``.

    Anyone who knows or guesses the seed can subtract the noise. For tests and experiments only.
    The generator advances with every draw, so successive releases get fresh, independent noise
    and the whole sequence is reproducible.
    """

    def __init__(self, seed: int) -> None:
        self._gen = np.random.Generator(np.random.PCG64(seed))

    @property
    def secure(self) -> bool:
        """Always False."""
        return False

    def bytes(self, n: int) -> bytes:
        """``n`` bytes from the seeded generator."""
        return self._gen.bytes(n)


def random_source(seed: int | None) -> RandomSource:
    """:class:`OsRandom` for ``seed=None``, else :class:`InsecureSeededRandom` (``seed`` int)."""
    if seed is None:
        return OsRandom()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", seed, "must be an integer (or None for the secure OS CSPRNG)")
    return InsecureSeededRandom(seed)
