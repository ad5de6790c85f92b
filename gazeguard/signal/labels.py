"""Private labels: classify the clean features inside the trusted process, release only the label.

Where a consumer needs *what the person is doing* rather than a feature stream, the sidecar runs a
classifier on the clean feature vectors (they never leave the process), makes one decision every
``decision_s`` seconds and releases only that decision, privatized by k-ary **randomized
response** at ε per decision.

Mechanism (k-ary randomized response, Warner 1965; Kairouz et al. 2016)
    Over ``C`` classes, report the true class ``y`` with probability ``p = e^ε / (e^ε + C − 1)``
    and each other class with ``q = 1 / (e^ε + C − 1)``. For any two true classes ``y, y'`` and
    any output ``o``, ``P(o | y) / P(o | y') ∈ {p/q, 1, q/p}`` and ``p/q = e^ε``: the release is
    ε-differentially private with respect to *any* change of the decision's input (every
    feature vector of the window may change), because the label is a function of that input and
    randomized response is ε-DP on the label. The classifier is post-processing-free: its output
    is the input of the mechanism, so no property of the model (public or a consumer's own)
    weakens the guarantee. Decisions compose sequentially: ``B/ε`` decisions cost ``B``.

Sampling exactly (:class:`RandomizedResponse`, why it is equivalent to OpenDP and safe)
    OpenDP's ``make_randomized_response(categories, prob)`` draws a Bernoulli(prob) exactly and,
    on failure, a uniform other category; its privacy map reports ``ln(prob·(C−1)/(1−prob))``
    rounded up. We draw the same distribution with integers only, so no floating-point
    operation touches the sampling: weights ``a`` for the true class and ``b = 2^64`` for each
    other class, with ``a = ⌊b·e^ε⌋ − 1`` computed with 100-digit decimal arithmetic (correctly
    rounded ``exp``; the ``− 1`` absorbs its rounding, so ``a < b·e^ε`` holds rigorously — and
    ``b·e^ε`` is never an integer, ``e^ε`` being transcendental for rational ε ≠ 0). One integer
    ``U`` uniform on ``[0, a + (C − 1)·b)`` is drawn by rejection sampling from ``os.urandom``
    bits (each accepted value equally likely: exact); ``U < a`` reports the true class, else
    class ``⌊(U − a)/b⌋`` among the other ``C − 1`` in order. The realized likelihood ratio is
    ``a/b < e^ε`` exactly, so the realized mechanism is ε′-DP with ``ε′ = ln(a/b) ≤ ε`` and the
    charged ε is an upper bound, not an approximation; its survival probability
    ``a / (a + (C−1)·b)`` falls short of the ideal ``p`` by less than ``2^-62`` (it is what
    :attr:`RandomizedResponse.survival` reports). ``tests/offline/test_labels.py`` compares the
    exact pmf, OpenDP's draws and ours (chi-square).

What a label keeps (:func:`survival_probability`, :func:`released_accuracy`)
    The true label survives with ``p = e^ε/(e^ε + C − 1)`` (6 classes, ε = 3: 0.80); how many
    decisions a budget buys is the release plan's business (:mod:`gazeguard.plan`: the
    decisions one hour of gaze can change, composed by the accountant). A classifier of clean
    accuracy ``acc`` gives released labels of expected accuracy
    ``p·acc + (1 − p)·(1 − acc)/(C − 1)`` (a wrong clean label becomes right only when the
    mechanism happens to pick the true class among the ``C − 1`` others).

Model format (:class:`LabelModel`, JSON, never pickle)
    A standardiser and a linear softmax classifier (multinomial logistic regression, or LDA
    written in the same form): ``z = (x − mean)/scale``, ``logits = coef·z + intercept``,
    ``P = softmax(logits)``. The file names its features (which must match the configured
    release profile: :func:`load_model` refuses otherwise), its classes, the gazeguard version
    and a format version. Inference is numpy only; training (:func:`train_model`) uses
    scikit-learn and is needed only where models are built, not in the sidecar. Loading a JSON
    file runs no code, unlike a pickle.

Feature transform and per-session standardisation (optional, same format version)
    ``standardizer.transform`` names a per-feature transform applied first: ``"log"`` is
    ``u = ln(x + log_offset)`` (a change of units or field of view, ``x → k·x``, becomes a shift
    ``ln k`` of ``u`` for ``x ≫ log_offset``), ``"identity"`` is ``u = x``. Then
    ``g = (u − mean)/scale`` (the training population). With ``standardizer.session`` the model
    also standardises each feature by the **session's own running statistics**, online: for
    the session's n-th window (n = 1, 2, … in time order, this window included) with
    ``d_i = u_i − mean`` and ``n0 = session.prior_windows``,
    ``m_n = Σ d_i / (n0 + n)``, ``v_n = (n0·scale² + Σ d_i²)/(n0 + n) − m_n²`` and
    ``s = (d_n − m_n)/√v_n``: the running mean and variance of the session's windows so far,
    shrunk towards the population as if ``n0`` population windows had come first (so the first
    windows are standardised by the population and a long session by itself). ``combine:
    "replace"`` feeds ``s`` to the classifier, ``"append"`` feeds ``[g, s]`` (2F columns).
    :class:`SessionStandardizer` keeps the state of one session (:meth:`LabelModel.new_session`).

    This is **not free**: the statistics stay inside the trusted process, but every label then
    depends on every earlier window of the session, so one raw gaze sample reaches every later
    label (changing 3 blocks of a stream changed decisions 13 blocks later), far beyond the
    reach the release plan declares and charges. The sidecar therefore refuses such a model:
    :func:`model_from_dict` (every model file, for ``labels.model`` and ``cohort.model`` alike)
    and :class:`LabelRelease` raise :class:`~gazeguard.core.errors.ConfigError` naming
    ``standardizer.session``. The format and :func:`train_model` keep it for offline model
    selection only (``bench/train_label_model.py`` compares such candidates; none is shipped).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gazeguard.core.errors import ConfigError
from gazeguard.core.version import __version__
from gazeguard.privacy.mechanisms.exact import uniform_below
from gazeguard.privacy.mechanisms.randomness import OsRandom, RandomSource
from gazeguard.signal.dataset import FeatureTable, subsample
from gazeguard.signal.files import check_feature_names, read_named_json, validation_error
from gazeguard.signal.profiles import unique_names

if TYPE_CHECKING:
    from gazeguard.signal.profiles import Profile

FloatArray = npt.NDArray[np.float64]

MODEL_FORMAT: Final = "gazeguard.label-model/1"
MECHANISM: Final = "randomized_response"
#: Largest ε per decision accepted (p > 1 − 1e-20 at C = 2: no privacy worth the name).
MAX_EPSILON: Final = 50.0
#: Smallest ε per decision accepted (below it ``a = ⌊2^64·e^ε⌋ − 1`` could fall below ``b``).
MIN_EPSILON: Final = 2.0**-40
#: Most classes a label model may have.
MAX_CLASSES: Final = 256
#: ``b``, the integer weight of each non-true class: ``2^WEIGHT_BITS``.
WEIGHT_BITS: Final = 64


# =========================================================================== budget arithmetic
def _check_classes(classes: int, field_name: str = "classes") -> int:
    if isinstance(classes, bool) or not isinstance(classes, int) or not 2 <= classes <= MAX_CLASSES:
        raise ConfigError(field_name, classes, f"must be an integer in 2..{MAX_CLASSES}")
    return classes


def _check_epsilon(epsilon: float, field_name: str = "epsilon") -> float:
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, int | float)
        or not math.isfinite(epsilon)
        or not MIN_EPSILON <= epsilon <= MAX_EPSILON
    ):
        raise ConfigError(
            field_name,
            epsilon,
            f"ε per decision must be a finite number in [{MIN_EPSILON:.3g}, {MAX_EPSILON:g}]",
        )
    return float(epsilon)


def _check_probability(value: float, field_name: str, lo: float = 0.0) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or not lo <= value <= 1.0:
        raise ConfigError(field_name, value, f"must be a probability in [{lo:g}, 1]")
    return float(value)


def survival_probability(epsilon: float, classes: int) -> float:
    """Probability ``e^ε / (e^ε + C − 1)`` that randomized response reports the true class.

    Args:
        epsilon: ε per decision (> 0).
        classes: C, the number of classes (≥ 2).

    >>> round(survival_probability(3.0, 6), 4)
    0.8007
    """
    e = _check_epsilon(epsilon)
    c = _check_classes(classes)
    return 1.0 / (1.0 + (c - 1) * math.exp(-e))


def epsilon_for_survival(survival: float, classes: int) -> float:
    """The ε per decision at which the true class survives with probability ``survival``:
    ``ln(p·(C − 1)/(1 − p))`` (the inverse of :func:`survival_probability`).

    Raises:
        ConfigError: ``survival`` not in ``(1/C, 1)`` (at ``1/C`` the label says nothing; 1 needs
            ε = ∞).
    """
    c = _check_classes(classes)
    p = _check_probability(survival, "survival")
    if not 1.0 / c < p < 1.0:
        raise ConfigError(
            "survival", survival, f"must lie strictly between 1/C = {1 / c:.4g} and 1"
        )
    return math.log(p * (c - 1) / (1.0 - p))


def released_accuracy(clean_accuracy: float, survival: float, classes: int) -> float:
    """Expected accuracy of the released label: ``p·acc + (1 − p)·(1 − acc)/(C − 1)``.

    A correct clean decision stays correct with probability ``p``; a wrong one becomes correct
    only when the mechanism picks the true class among the ``C − 1`` others (``(1 − p)/(C − 1)``).
    """
    c = _check_classes(classes)
    acc = _check_probability(clean_accuracy, "clean_accuracy")
    p = _check_probability(survival, "survival")
    return p * acc + (1.0 - p) * (1.0 - acc) / (c - 1)


# =========================================================================== randomized response
def rr_weights(epsilon: float, bits: int = WEIGHT_BITS) -> tuple[int, int]:
    """Integer weights ``(a, b)`` of randomized response with ``a/b < e^ε`` rigorously.

    ``b = 2^bits``; ``a = ⌊b·E⌋ − 1`` where ``E`` is ``exp(ε)`` correctly rounded to 100 decimal
    digits (``ε`` is converted exactly from its float). ``|b·E − b·e^ε| < 1`` for ε ≤ 50 and
    ``bits ≤ 64``, so ``a ≤ ⌊b·e^ε⌋ < b·e^ε`` (never equal: ``e^ε`` is transcendental), and
    ``a/b > e^ε − 3·2^-bits``.
    """
    e = _check_epsilon(epsilon)
    b = 1 << bits
    with localcontext() as ctx:
        ctx.prec = 100
        big = (Decimal(e).exp() * b).to_integral_value(rounding=ROUND_FLOOR)
    a = int(big) - 1
    if a < b:  # pragma: no cover - excluded by MIN_EPSILON
        msg = f"ε={e!r} is too small for randomized response with 2^{bits} weights"
        raise ConfigError("epsilon", e, msg)
    return a, b


class RandomizedResponse:
    """k-ary randomized response over ``classes`` classes at ``epsilon``, sampled exactly.

    See the module docstring for the mechanism and the proof. Build once per (C, ε); draws are
    independent.

    Attributes:
        classes: C.
        epsilon: the ε charged per decision.
        weight_true, weight_other: the integer weights ``a`` and ``b``.
    """

    def __init__(self, classes: int, epsilon: float) -> None:
        self.classes = _check_classes(classes)
        self.epsilon = _check_epsilon(epsilon)
        self.weight_true, self.weight_other = rr_weights(self.epsilon)
        self._total = self.weight_true + (self.classes - 1) * self.weight_other

    @property
    def survival_exact(self) -> Fraction:
        """The realized probability of reporting the true class, ``a/(a + (C−1)·b)``."""
        return Fraction(self.weight_true, self._total)

    @property
    def survival(self) -> float:
        """:attr:`survival_exact` as a float (within 2^-62 of ``e^ε/(e^ε + C − 1)``, below it)."""
        return float(self.survival_exact)

    @property
    def epsilon_realized(self) -> float:
        """``ln(a/b)``: the privacy loss the realized mechanism actually has, ``≤ epsilon``
        (computed with 60-digit decimals, then rounded to the nearest float)."""
        with localcontext() as ctx:
            ctx.prec = 60
            return float((Decimal(self.weight_true) / Decimal(self.weight_other)).ln())

    def pmf(self, true_index: int) -> tuple[Fraction, ...]:
        """The exact output distribution for true class ``true_index``."""
        self._check_index(true_index)
        other = Fraction(self.weight_other, self._total)
        return tuple(self.survival_exact if j == true_index else other for j in range(self.classes))

    def _check_index(self, true_index: int) -> None:
        if isinstance(true_index, bool) or not 0 <= int(true_index) < self.classes:
            msg = f"true class index {true_index!r} is not in 0..{self.classes - 1}"
            raise ValueError(msg)

    def release(self, true_index: int, source: RandomSource | None = None) -> int:
        """The privatized class index for true class ``true_index`` (one draw).

        Args:
            true_index: 0-based index of the clean decision.
            source: random bytes; None: the OS CSPRNG
                (:class:`~gazeguard.privacy.mechanisms.randomness.OsRandom`).
        """
        self._check_index(true_index)
        t = int(true_index)
        u = uniform_below(self._total, source if source is not None else OsRandom())
        if u < self.weight_true:
            return t
        j = (u - self.weight_true) // self.weight_other
        return j if j < t else j + 1


# =========================================================================== the model format
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=200)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Transform = Literal["identity", "log"]


class SessionSpec(_Strict):
    """Per-session online standardisation (see the module docstring): for offline model
    selection only; a model file with it is refused (:func:`check_stateless`).

    Attributes:
        prior_windows: ``n0``, how many population windows the running statistics start from
            (> 0; at the default 0.5 s step, 120 windows are one minute of gaze).
        combine: ``"replace"``: the classifier reads the session-standardised features only
            (F columns); ``"append"``: the population- and session-standardised ones (2F).
    """

    prior_windows: float = Field(gt=0.0, allow_inf_nan=False)
    combine: Literal["replace", "append"] = "append"


class Standardizer(_Strict):
    """``g = (u − mean)/scale`` per feature, ``u`` the transformed feature (training rows' mean
    and standard deviation of ``u``), optionally with per-session standardisation.

    Attributes:
        mean, scale: (F,) each, in the transformed units.
        transform: (F,) ``"identity"`` or ``"log"`` (``u = ln(x + log_offset)``); None: all
            identity (the original format).
        log_offset: the offset of the log transform, in the feature's own unit.
        session: per-session standardisation (offline only: the sidecar refuses it), or None
            (population only).
    """

    mean: list[FiniteFloat]
    scale: list[Annotated[float, Field(gt=0.0, allow_inf_nan=False)]]
    transform: list[Transform] | None = None
    log_offset: float = Field(0.01, gt=0.0, allow_inf_nan=False)
    session: SessionSpec | None = None


class HiddenLayer(_Strict):
    """One hidden layer: ``h = max(0, coef · x + intercept)`` (ReLU).

    Attributes:
        coef: (H, width of the layer's input).
        intercept: (H,).
    """

    coef: list[list[FiniteFloat]] = Field(min_length=1)
    intercept: list[FiniteFloat] = Field(min_length=1)


class Classifier(_Strict):
    """``P(class) = softmax(coef · h + intercept)``.

    ``kind = "linear-softmax"`` (the default): ``h = z``, the standardised features
    (multinomial logistic regression, or LDA). ``kind = "mlp-softmax"``: a multilayer
    perceptron (e.g. scikit-learn's ``MLPClassifier``): ``h₀ = z``, ``hᵢ = max(0, Wᵢ·hᵢ₋₁ +
    bᵢ)`` through ``hidden``, input side first.

    Attributes:
        kind: ``"linear-softmax"`` or ``"mlp-softmax"``.
        hidden: the hidden layers (none for a linear softmax, at least one for an MLP).
        coef: (C, width of ``h``); intercept: (C,).
    """

    kind: Literal["linear-softmax", "mlp-softmax"] = "linear-softmax"
    hidden: list[HiddenLayer] = Field(default_factory=list)
    coef: list[list[FiniteFloat]]
    intercept: list[FiniteFloat]

    @model_validator(mode="after")
    def _layers(self) -> Classifier:
        if (self.kind == "mlp-softmax") != bool(self.hidden):
            msg = (
                f"hidden: a {self.kind!r} classifier has "
                + ("at least one hidden layer" if self.kind == "mlp-softmax" else "none")
                + f", got {len(self.hidden)}"
            )
            raise ValueError(msg)
        return self


class ModelFile(_Strict):
    """The JSON file of a label model (``format: gazeguard.label-model/1``).

    Attributes:
        format: the format version.
        name, version: the model's name and version (published with every label).
        profile: the release profile the model was trained for (informational; the feature
            list is what is checked).
        features: the F feature names the model reads, in the order of its coefficients.
        classes: the C class names, in the order of its coefficients.
        window_s, step_s: feature window and step the model was trained with, s.
        standardizer: per-feature transform, mean and scale, (F,) each, and the optional
            per-session standardisation.
        classifier: ``linear-softmax``: ``coef`` (C, F), or (C, 2F) with
            ``standardizer.session.combine == "append"``, and ``intercept`` (C,);
            ``mlp-softmax``: hidden layers (the first reads those F or 2F columns), then
            ``coef`` (C, H) and ``intercept`` (C,).
        gazeguard_version: version of gazeguard that wrote the file.
        trained: free-form provenance (dataset, rows, date, cross-validated accuracy…).
    """

    format: Literal["gazeguard.label-model/1"]
    name: Name
    version: Name
    profile: Name | None = None
    features: list[Name] = Field(min_length=1)
    classes: list[Name] = Field(min_length=2, max_length=MAX_CLASSES)
    window_s: float = Field(30.0, gt=0.0, allow_inf_nan=False)
    step_s: float = Field(0.5, gt=0.0, allow_inf_nan=False)
    standardizer: Standardizer
    classifier: Classifier
    gazeguard_version: Name
    trained: dict[str, Any] = Field(default_factory=dict)

    @field_validator("features", "classes")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return unique_names(v, "duplicate names")

    @model_validator(mode="after")
    def _shapes(self) -> ModelFile:
        F, C = len(self.features), len(self.classes)
        s = self.standardizer
        if len(s.mean) != F or len(s.scale) != F:
            msg = (
                f"standardizer: mean has {len(s.mean)} and scale {len(s.scale)} entries, "
                f"expected one per feature ({F})"
            )
            raise ValueError(msg)
        if s.transform is not None and len(s.transform) != F:
            msg = f"standardizer.transform: has {len(s.transform)} entries, expected F = {F}"
            raise ValueError(msg)
        k = self.classifier
        width = 2 * F if s.session is not None and s.session.combine == "append" else F
        what = "[C][2F]" if width != F else "[C][F]"
        for i, layer in enumerate(k.hidden):
            _check_matrix(layer.coef, len(layer.intercept), width, f"classifier.hidden.{i}")
            width = len(layer.intercept)
            what = "[C][H]"
        _check_matrix(k.coef, C, width, "classifier", what)
        if len(k.intercept) != C:
            msg = f"classifier.intercept: has {len(k.intercept)} entries, expected C = {C}"
            raise ValueError(msg)
        return self


def _check_matrix(
    coef: list[list[float]], rows: int, width: int, where: str, what: str = "[H][input]"
) -> None:
    """Refuse a ``coef`` that is not ``rows`` × ``width``."""
    if len(coef) != rows or any(len(row) != width for row in coef):
        shape = f"[{len(coef)}][{', '.join(str(len(r)) for r in coef[:3])}...]"
        msg = f"{where}.coef: must be {what} = [{rows}][{width}], got {shape}"
        raise ValueError(msg)


class SessionStandardizer:
    """The running statistics of one session's windows (see the module docstring).

    Feed the session's windows in time order, each exactly once, through :meth:`update`
    (or :meth:`LabelModel.predict_proba` with ``session=``); the result for a window depends
    only on it and the windows before it, so blocks of any size give the same values as the
    whole session at once (:func:`session_standardize`).

    Args:
        mean, scale: (F,) the population mean and scale of the transformed features.
        prior_windows: ``n0``.

    Attributes:
        windows: n, how many windows the session has fed so far.
    """

    def __init__(self, mean: FloatArray, scale: FloatArray, prior_windows: float) -> None:
        self._mean = np.asarray(mean, np.float64)
        self._var0 = np.asarray(scale, np.float64) ** 2
        self.prior_windows = float(prior_windows)
        self.windows = 0
        self._s1 = np.zeros_like(self._mean)
        self._s2 = np.zeros_like(self._mean)

    def update(self, U: npt.ArrayLike) -> FloatArray:
        """Add the windows ``U`` and return them standardised by the statistics so far.

        Args:
            U: (T, F) transformed features of the session's next T windows, in time order.

        Returns:
            (T, F) ``s``: row i standardised by the running mean and variance over every window
            up to and including it, shrunk towards the population by ``prior_windows``.
        """
        u = np.asarray(U, np.float64)
        d = u - self._mean
        c1 = self._s1 + np.cumsum(d, axis=0)
        c2 = self._s2 + np.cumsum(d * d, axis=0)
        n = self.prior_windows + self.windows + np.arange(1, u.shape[0] + 1, dtype=np.float64)
        m = c1 / n[:, None]
        v = (self.prior_windows * self._var0 + c2) / n[:, None] - m * m
        v = np.maximum(v, 1e-12 * self._var0)
        if u.shape[0]:
            self._s1, self._s2 = c1[-1].copy(), c2[-1].copy()
            self.windows += u.shape[0]
        return np.asarray((d - m) / np.sqrt(v), np.float64)


def session_standardize(
    U: npt.ArrayLike, mean: npt.ArrayLike, scale: npt.ArrayLike, prior_windows: float
) -> FloatArray:
    """Offline form of :class:`SessionStandardizer`: the whole session at once.

    Args:
        U: (T, F) transformed features of one session, in time order.
        mean, scale: (F,) population mean and scale.
        prior_windows: ``n0``.

    Returns:
        (T, F): row n is ``(d_n − m_n)/√v_n`` with ``d = U − mean``,
        ``m_n = Σ_{i≤n} d_i/(n0 + n)`` and ``v_n = (n0·scale² + Σ_{i≤n} d_i²)/(n0 + n) − m_n²``
        (floored at ``1e-12·scale²``).
    """
    return SessionStandardizer(
        np.asarray(mean, np.float64), np.asarray(scale, np.float64), prior_windows
    ).update(U)


@dataclass(frozen=True)
class LabelModel:
    """A loaded label model; inference is numpy only.

    Attributes:
        spec: the validated file contents.
        source: where it was loaded from (for messages).
    """

    spec: ModelFile
    source: str = "<memory>"
    _mean: FloatArray = field(init=False, repr=False)
    _scale: FloatArray = field(init=False, repr=False)
    _coef: FloatArray = field(init=False, repr=False)
    _intercept: FloatArray = field(init=False, repr=False)
    _hidden: tuple[tuple[FloatArray, FloatArray], ...] = field(init=False, repr=False)
    _log: npt.NDArray[np.bool_] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        tr = self.spec.standardizer.transform or ["identity"] * len(self.spec.features)
        object.__setattr__(self, "_log", np.array([t == "log" for t in tr], dtype=bool))
        object.__setattr__(self, "_mean", np.asarray(self.spec.standardizer.mean, np.float64))
        object.__setattr__(self, "_scale", np.asarray(self.spec.standardizer.scale, np.float64))
        object.__setattr__(self, "_coef", np.asarray(self.spec.classifier.coef, np.float64))
        object.__setattr__(
            self, "_intercept", np.asarray(self.spec.classifier.intercept, np.float64)
        )
        hidden = tuple(
            (np.asarray(h.coef, np.float64), np.asarray(h.intercept, np.float64))
            for h in self.spec.classifier.hidden
        )
        object.__setattr__(self, "_hidden", hidden)

    @property
    def name(self) -> str:
        """Model name."""
        return self.spec.name

    @property
    def version(self) -> str:
        """Model version."""
        return self.spec.version

    @property
    def features(self) -> tuple[str, ...]:
        """Feature names, in the model's column order."""
        return tuple(self.spec.features)

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names, in the model's order."""
        return tuple(self.spec.classes)

    @property
    def per_session(self) -> bool:
        """Whether the model standardises by each session's running statistics (offline
        model selection only: :func:`check_stateless` refuses it for the sidecar)."""
        return self.spec.standardizer.session is not None

    def new_session(self) -> SessionStandardizer | None:
        """Fresh running statistics for a new session (None for a population-only model)."""
        sess = self.spec.standardizer.session
        if sess is None:
            return None
        return SessionStandardizer(self._mean, self._scale, sess.prior_windows)

    def transform(self, X: npt.ArrayLike) -> FloatArray:
        """``u``: the per-feature transform of (T, F) feature vectors (``ln(x + log_offset)``
        for the log features)."""
        x = self._checked(X)
        if not self._log.any():
            return x
        u = x.copy()
        off = self.spec.standardizer.log_offset
        lx = u[:, self._log] + off
        if (lx <= 0).any():
            msg = f"model {self.name!r}: a log feature is at or below -log_offset ({-off:g})"
            raise ValueError(msg)
        u[:, self._log] = np.log(lx)
        return u

    def inputs(self, X: npt.ArrayLike, session: SessionStandardizer | None = None) -> FloatArray:
        """What the classifier reads: (T, F) or (T, 2F) standardised features.

        Args:
            X: (T, F) clean feature vectors, in time order.
            session: the session's running statistics (updated with these rows); None: a
                fresh session made of ``X`` alone (per-session models only).
        """
        u = self.transform(X)
        g = (u - self._mean) / self._scale
        spec = self.spec.standardizer.session
        if spec is None:
            return g
        state = session if session is not None else self.new_session()
        assert state is not None
        s = state.update(u)
        return s if spec.combine == "replace" else np.hstack([g, s])

    def _checked(self, X: npt.ArrayLike) -> FloatArray:
        x = np.asarray(X, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self._mean.size:
            msg = (
                f"model {self.name!r} expects (T, {self._mean.size}) feature vectors "
                f"({', '.join(self.features)}), got shape {x.shape}"
            )
            raise ValueError(msg)
        if not np.isfinite(x).all():
            msg = f"model {self.name!r}: feature vectors must be finite"
            raise ValueError(msg)
        return x

    def predict_proba(
        self, X: npt.ArrayLike, session: SessionStandardizer | None = None
    ) -> FloatArray:
        """Class probabilities of each row.

        A per-session model (:attr:`per_session`) standardises each row by the running
        statistics of its session: pass the session's :meth:`new_session` state and feed every
        window of the session once, in time order; without ``session`` the rows of ``X`` are
        taken as one whole session from its start.

        Args:
            X: (T, F) clean feature vectors, columns in :attr:`features` order, feature units.
            session: running statistics of the rows' session (ignored by population-only
                models).

        Returns:
            (T, C) probabilities, rows summing to 1.
        """
        h = self.inputs(X, session)
        for w, b in self._hidden:
            h = np.maximum(h @ w.T + b, 0.0)
        logits = h @ self._coef.T + self._intercept
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return np.asarray(p, dtype=np.float64)

    def check_profile(self, features: Sequence[str], profile_name: str = "the profile") -> None:
        """Refuse unless the model reads exactly the profile's features (any order).

        Raises:
            ConfigError: naming both lists and what differs.
        """
        want, have = list(features), list(self.features)
        if set(want) == set(have) and len(want) == len(have):
            return
        missing = [f for f in want if f not in have]
        extra = [f for f in have if f not in want]
        raise ConfigError(
            "labels.model",
            self.source,
            f"model {self.name!r} reads features {have} but {profile_name} releases {want} "
            f"(model lacks {missing}, has extra {extra}); train the model on the profile's "
            "features (`gazeguard profile train-model --profile NAME`) or configure the profile "
            "the model was trained for",
        )

    def to_json(self) -> str:
        """The model file's JSON text."""
        return self.spec.model_dump_json(indent=1) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the model file (JSON); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json())
        return p


def model_from_dict(data: Any, source: str = "<memory>") -> LabelModel:
    """Validate a parsed model file (see :class:`ModelFile`); feature names must be known.

    Raises:
        ConfigError: naming the field, the value and the file.
    """
    try:
        spec = ModelFile.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, source) from None
    check_feature_names(spec.features, "features", source)
    model = LabelModel(spec, source)
    check_stateless(model, "standardizer.session")
    return model


def check_stateless(model: LabelModel, field_name: str = "labels.model") -> None:
    """Refuse a model that keeps per-session state (``standardizer.session``): its labels would
    depend on every earlier window of the session, a reach no release plan declares (module
    docstring).

    Raises:
        ConfigError: on ``field_name``, naming ``standardizer.session``.
    """
    sess = model.spec.standardizer.session
    if sess is None:
        return
    raise ConfigError(
        field_name,
        sess.model_dump(),
        f"model {model.name!r} standardises by per-session running statistics "
        "(standardizer.session): each label would depend on every earlier window of the "
        "session, so one raw gaze sample would reach every later label, beyond the reach the "
        "release plan declares and charges; gazeguard refuses such models for labels and "
        "cohorts alike. Use a model standardised by its training population only "
        "(standardizer.session null, as the shipped models are)",
        model.source,
    )


def shipped_models() -> list[str]:
    """Names of the models shipped in ``gazeguard/data/models/``."""
    root = resources.files("gazeguard") / "data" / "models"
    if not root.is_dir():
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def load_model(name_or_path: str | Path, profile: Profile | None = None) -> LabelModel:
    """Load a label model by shipped name (``"activity"``) or path to its JSON file.

    Args:
        name_or_path: a name from :func:`shipped_models`, or a path (contains ``/`` or ends in
            ``.json``).
        profile: the configured release profile; the model must read exactly its features.

    Raises:
        ConfigError: file missing, not JSON, malformed (naming the field), unknown features
            (with a did-you-mean), or features that do not match ``profile`` (naming both lists).
    """
    data, source = read_named_json(name_or_path, "model", shipped_models())
    model = model_from_dict(data, source)
    if profile is not None:
        model.check_profile(profile.features, f"profile {profile.name!r}")
    return model


def train_model(
    table: FeatureTable,
    features: Sequence[str],
    *,
    name: str,
    version: str | None = None,
    profile: str | None = None,
    regularization: float = 1.0,
    window_s: float = 30.0,
    step_s: float = 0.5,
    every: int = 1,
    provenance: dict[str, Any] | None = None,
    labels: npt.ArrayLike | None = None,
    log_features: Sequence[str] = (),
    log_offset: float = 0.01,
    session: SessionSpec | None = None,
    sessions: npt.ArrayLike | None = None,
    sample_weight: npt.ArrayLike | None = None,
    hidden_layers: Sequence[int] = (),
    seed: int = 0,
) -> LabelModel:
    """Train standardiser + multinomial logistic regression, or a multilayer perceptron
    (scikit-learn), on a labelled table and export it as a :class:`LabelModel`.

    Args:
        table: labelled public recordings (never a user's data); ``table.task`` is the class.
        features: the columns the model reads (the release profile's features).
        name, version, profile: recorded in the file (``version`` defaults to today's date).
        regularization: inverse L2 strength ``C`` of scikit-learn's LogisticRegression.
        every: train on every n-th window of each recording (1: all).
        provenance: merged into the file's ``trained`` section.
        labels: (N,) class of each row instead of ``table.task`` (e.g. a common activity).
        log_features: features read through ``ln(x + log_offset)``.
        session: per-session standardisation (None: population only).
        sessions: (N,) session id of each row (with ``session``; default: the recording); a
            session's rows must be in time order, its statistics run over all of them (before
            ``every`` thins the training rows).
        sample_weight: (N,) weight of each row in the fit (e.g. balancing datasets).
        hidden_layers: widths of ReLU hidden layers (empty: logistic regression); an MLP's L2
            penalty is ``alpha = 1/regularization``, with early stopping on a held-out tenth.
        seed: the MLP's initialisation and validation split.
    """
    check_feature_names(features, "features", "train_model")
    check_feature_names(log_features, "log_features", "train_model")
    cols = np.array([table.feature_names.index(f) for f in features], dtype=np.intp)
    rows = subsample(np.arange(table.n_rows), table.recording, every)
    logs = np.array([f in set(log_features) for f in features], dtype=bool)
    U = np.asarray(table.X[:, cols], np.float64).copy()
    U[:, logs] = np.log(U[:, logs] + log_offset)
    mean = U[rows].mean(axis=0)
    scale = U[rows].std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    Z = (U - mean) / scale
    if session is not None:
        sid = np.asarray(table.recording if sessions is None else sessions).astype(str)
        S = np.empty_like(U)
        _, first = np.unique(sid, return_index=True)
        for key in sid[np.sort(first)]:
            at = np.flatnonzero(sid == key)
            S[at] = session_standardize(U[at], mean, scale, session.prior_windows)
        Z = S if session.combine == "replace" else np.hstack([Z, S])
    y = (table.task if labels is None else np.asarray(labels))[rows].astype(str)
    w = None if sample_weight is None else np.asarray(sample_weight, np.float64)[rows]
    classes, classifier, estimator = _fit_classifier(
        Z[rows], y, w, regularization=regularization, hidden_layers=tuple(hidden_layers), seed=seed
    )
    now = datetime.now(UTC)
    import sklearn  # noqa: PLC0415 - the eval extra

    trained: dict[str, Any] = {
        "estimator": estimator,
        "regularization_C": regularization,
        "rows": int(rows.size),
        "people": sorted(set(table.person.tolist())),
        "date": now.isoformat(timespec="seconds"),
        "scikit_learn_version": sklearn.__version__,
    }
    trained.update(provenance or {})
    spec = ModelFile(
        format=MODEL_FORMAT,
        name=name,
        version=version or now.strftime("%Y-%m-%d"),
        profile=profile,
        features=list(features),
        classes=classes,
        window_s=window_s,
        step_s=step_s,
        standardizer=Standardizer(
            mean=mean.tolist(),
            scale=scale.tolist(),
            transform=["log" if v else "identity" for v in logs] if logs.any() else None,
            log_offset=log_offset,
            session=session,
        ),
        classifier=classifier,
        gazeguard_version=__version__,
        trained=trained,
    )
    return LabelModel(spec, f"trained {name!r}")


def _fit_classifier(
    Z: FloatArray,
    y: npt.NDArray[np.str_],
    w: FloatArray | None,
    *,
    regularization: float,
    hidden_layers: tuple[int, ...],
    seed: int,
) -> tuple[list[str], Classifier, str]:
    """Fit scikit-learn's classifier on standardised rows ``Z`` (N, width): the class names,
    the exported :class:`Classifier` and a description of the estimator."""
    if not hidden_layers:
        from sklearn.linear_model import LogisticRegression  # noqa: PLC0415 - the eval extra

        lr = LogisticRegression(C=regularization, max_iter=5000)
        lr.fit(Z, y, sample_weight=w)
        coef = np.asarray(lr.coef_, np.float64)
        intercept = np.asarray(lr.intercept_, np.float64)
        if coef.shape[0] == 1:  # binary: scikit-learn keeps one row; softmax form needs two
            coef = np.vstack([-coef / 2, coef / 2])
            intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
        return (
            [str(c) for c in lr.classes_],
            Classifier(coef=coef.tolist(), intercept=intercept.tolist()),
            "sklearn.linear_model.LogisticRegression (multinomial, L2)",
        )
    from sklearn.neural_network import MLPClassifier  # noqa: PLC0415 - the eval extra

    mlp = MLPClassifier(
        hidden_layers,
        alpha=1.0 / regularization,
        max_iter=300,
        early_stopping=True,
        random_state=seed,
    )
    mlp.fit(Z, y, sample_weight=w)
    ws = [np.asarray(c, np.float64).T for c in mlp.coefs_]  # (out, in) each
    bs = [np.asarray(b, np.float64) for b in mlp.intercepts_]
    out_w, out_b = ws[-1], bs[-1]
    if out_w.shape[0] == 1:  # binary: one logistic output z; softmax([-z/2, z/2]) is the same
        out_w = np.vstack([-out_w / 2, out_w / 2])
        out_b = np.array([-out_b[0] / 2, out_b[0] / 2])
    hidden = [
        HiddenLayer(coef=a.tolist(), intercept=b.tolist())
        for a, b in zip(ws[:-1], bs[:-1], strict=True)
    ]
    return (
        [str(c) for c in mlp.classes_],
        Classifier(
            kind="mlp-softmax", hidden=hidden, coef=out_w.tolist(), intercept=out_b.tolist()
        ),
        f"sklearn.neural_network.MLPClassifier (ReLU {list(hidden_layers)}, softmax, "
        f"alpha {1.0 / regularization:g}, early stopping, seed {seed})",
    )


def lopo_probabilities(
    table: FeatureTable,
    features: Sequence[str],
    *,
    regularization: float = 1.0,
    every: int = 1,
    progress: Callable[[str], None] | None = None,
) -> FloatArray:
    """Leave-one-person-out class probabilities of every window (scikit-learn, build time).

    For each person, :func:`train_model` on every other person (every ``every``-th window) and
    :meth:`LabelModel.predict_proba` on all of the held-out person's windows: how the shipped
    model (trained on everyone) does on someone it has never seen.

    Returns:
        (N, C) probabilities, columns in sorted task order (``sorted(set(table.task))``).
    """
    classes = sorted(set(table.task.tolist()))
    out = np.zeros((table.n_rows, len(classes)))
    for who in sorted(set(table.person.tolist())):
        test = table.person == who
        train = np.flatnonzero(~test)
        sub = table.take(train)
        model = train_model(sub, features, name="lopo", regularization=regularization, every=every)
        cols = np.array([table.feature_names.index(f) for f in model.features], dtype=np.intp)
        p = model.predict_proba(table.X[np.ix_(np.flatnonzero(test), cols)])
        for j, c in enumerate(model.classes):
            out[test, classes.index(c)] = p[:, j]
        if progress is not None:
            progress(f"leave-one-person-out: {who} done")
    return out


# =========================================================================== the release
@dataclass(frozen=True)
class LabelDecision:
    """One released label. Nothing here is the clean decision.

    Attributes:
        label: the privatized class name.
        index: its index in ``classes``.
        classes: the C class names.
        epsilon: ε charged for this decision.
        survival: probability the true class was reported (``≈ e^ε/(e^ε + C − 1)``, exact
            realized value).
        mechanism: ``"randomized_response"``.
        vectors: feature vectors the decision summarised.
        noise: ``"os-csprng"`` or ``"INSECURE-seeded"``.
    """

    label: str
    index: int
    classes: tuple[str, ...]
    epsilon: float
    survival: float
    vectors: int
    noise: Literal["os-csprng", "INSECURE-seeded"]
    mechanism: Literal["randomized_response"] = MECHANISM


def release_label(
    X: npt.ArrayLike,
    model: LabelModel,
    epsilon: float,
    source: RandomSource | None = None,
    input_features: Sequence[str] | None = None,
) -> LabelDecision:
    """One private label from the clean feature vectors of one decision window (pure function of
    its arguments and the random bytes).

    Args:
        X: (T, F_in) clean feature vectors of the window (T ≥ 1), columns ``input_features``.
        model: the label model.
        epsilon: ε per decision.
        source: random bytes; None: the OS CSPRNG.
        input_features: names of ``X``'s columns (None: the model's own features, in order).
    """
    return LabelRelease(model, epsilon, input_features=input_features, source=source).release(X)


class LabelRelease:
    """Turns the clean feature vectors of each decision window into one private label.

    Per decision: the model's class probabilities, averaged over the window's vectors (a
    function of that window alone: a model with per-session state is refused,
    :func:`check_stateless`); the argmax is the clean decision (it never leaves this object);
    randomized response at ``epsilon`` releases a label (:class:`RandomizedResponse`). The
    caller charges ``epsilon`` per decision to the ledger and publishes :class:`LabelDecision`.

    Args:
        model: the label model (its features must match the configured profile: see
            :func:`load_model`; no per-session state).
        epsilon: ε per decision.
        input_features: names of the columns of the vectors passed to :meth:`release` (default:
            the model's features in its order; e.g. ``gazeguard.signal.features.NAMES`` for full
            48-feature vectors). Every model feature must be among them.
        source: random bytes (None: :class:`~gazeguard.privacy.mechanisms.randomness.OsRandom`).

    Raises:
        ConfigError: a model with per-session state (``standardizer.session``), or input
            vectors that lack one of its features.
    """

    def __init__(
        self,
        model: LabelModel,
        epsilon: float,
        *,
        input_features: Sequence[str] | None = None,
        source: RandomSource | None = None,
    ) -> None:
        check_stateless(model)
        self.model = model
        self.rr = RandomizedResponse(len(model.classes), epsilon)
        names = list(model.features if input_features is None else input_features)
        missing = [f for f in model.features if f not in names]
        if missing:
            raise ConfigError(
                "labels.input_features",
                names,
                f"model {model.name!r} needs features {missing} that the input vectors lack",
            )
        self._cols = np.array([names.index(f) for f in model.features], dtype=np.intp)
        self._width = len(names)
        self.source: RandomSource = source if source is not None else OsRandom()

    @property
    def epsilon(self) -> float:
        """ε per decision."""
        return self.rr.epsilon

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names."""
        return self.model.classes

    @property
    def survival(self) -> float:
        """Probability that a decision's true class is released."""
        return self.rr.survival

    def probabilities(self, X: npt.ArrayLike) -> FloatArray:
        """(C,) the model's class probabilities averaged over a window's vectors (clean: they
        never leave the trusted process).

        Args:
            X: (T, F_in) clean feature vectors, T ≥ 1, columns as ``input_features``.
        """
        x = np.asarray(X, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self._width or x.shape[0] < 1:
            msg = f"a decision needs (T >= 1, {self._width}) feature vectors, got shape {x.shape}"
            raise ValueError(msg)
        p = self.model.predict_proba(x[:, self._cols])
        return np.asarray(p.mean(axis=0), np.float64)

    def release(self, X: npt.ArrayLike) -> LabelDecision:
        """One private label for a decision window: randomized response on the argmax of
        :meth:`probabilities` (ties: the lowest class index).

        Args:
            X: (T, F_in) clean feature vectors, T ≥ 1, columns as ``input_features``.
        """
        p = self.probabilities(X)
        return self.release_class(int(np.argmax(p)), vectors=int(np.shape(X)[0]))

    def release_class(self, true: int, *, vectors: int) -> LabelDecision:
        """Randomized response on the clean class index ``true`` (of a window of ``vectors``
        feature vectors)."""
        out = self.rr.release(true, self.source)
        return LabelDecision(
            label=self.classes[out],
            index=out,
            classes=self.classes,
            epsilon=self.epsilon,
            survival=self.survival,
            vectors=int(vectors),
            noise="os-csprng" if self.source.secure else "INSECURE-seeded",
        )
