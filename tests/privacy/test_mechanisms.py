"""The mechanisms against independent numpy/scipy implementations, their reported parameters,
their refusals, k="auto" and FFTW plan reuse."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import scipy.fft

import gazeguard.privacy.mechanisms as mechanisms_package
from gazeguard.cli.mechanisms import main as prior_main
from gazeguard.core.errors import ConfigError, DatasetError
from gazeguard.privacy.mechanisms import (
    Bounds,
    PriorSpectrum,
    choose_k,
    default_prior,
    difference_sensitivity_l2,
    estimate_prior,
    expected_mse,
    inverse,
    load_wisdom,
    make_mechanism,
    raw_sensitivity_l2,
    save_wisdom,
)
from gazeguard.privacy.mechanisms import transforms as tr_mod
from gazeguard.privacy.mechanisms.discrete_laplace import SAMPLER_LOSS_PER_COORDINATE
from gazeguard.privacy.mechanisms.prior import DEFAULT_PATH
from gazeguard.signal.dataset import FeatureTable

FloatArray = npt.NDArray[np.float64]
LO, HI, STEP = -1.0, 3.0, 0.3


def lowpass_numpy(s: FloatArray, k: int, transform: str) -> FloatArray:
    """k-frequency low-pass of each row, computed with numpy.fft (dft) or scipy.fft (dct)."""
    n = s.shape[1]
    if transform == "dft":
        spec = np.fft.rfft(s, axis=1)
        spec[:, k:] = 0
        return np.fft.irfft(spec, n=n, axis=1)
    c = scipy.fft.dct(s, type=2, norm="ortho", axis=1)
    c[:, k:] = 0
    return scipy.fft.idct(c, type=2, norm="ortho", axis=1)


def signal(rng: np.random.Generator, f: int, n: int) -> FloatArray:
    """Smooth random signals that leave the bounds now and then (so clipping matters)."""
    walk = np.cumsum(rng.normal(0, 0.4, (f, n)), axis=1)
    return walk + rng.uniform(LO, HI, (f, 1))


@pytest.mark.parametrize("transform", ["dft", "dct"])
@pytest.mark.parametrize(("name", "n"), [("cfpa", 64), ("fpa", 50), ("fpa", 64)])
def test_noise_free_fpa_equals_numpy_lowpass(name: str, n: int, transform: str) -> None:
    rng = np.random.default_rng(1)
    x = signal(rng, 7, n)
    k = 5
    mech = make_mechanism(name, n=n, k=k, epsilon=1.0, bounds=Bounds(LO, HI), transform=transform)
    expected = np.clip(lowpass_numpy(np.clip(x, LO, HI), k, transform), LO, HI)
    np.testing.assert_allclose(mech.nonprivate_projection(x), expected, atol=1e-12)


@pytest.mark.parametrize("transform", ["dft", "dct"])
def test_noise_free_dcfpa_equals_lowpass_of_clipped_differences_then_cumsum(
    transform: str,
) -> None:
    rng = np.random.default_rng(2)
    n, k = 32, 6
    x = signal(rng, 9, n)
    mech = make_mechanism(
        "dcfpa", n=n, k=k, epsilon=1.0, bounds=Bounds(LO, HI, STEP), transform=transform
    )
    xc = np.clip(x, LO, HI)
    d = np.diff(xc, axis=1, prepend=LO)  # D_1 = x_1 − lo
    d[:, 1:] = np.clip(d[:, 1:], -STEP, STEP)
    expected = np.clip(np.cumsum(lowpass_numpy(d, k, transform), axis=1) + LO, LO, HI)
    np.testing.assert_allclose(mech.nonprivate_projection(x), expected, atol=1e-12)


def test_noise_free_lpa_is_clipping() -> None:
    x = signal(np.random.default_rng(3), 4, 20)
    mech = make_mechanism("lpa", n=20, epsilon=1.0, bounds=Bounds(LO, HI))
    np.testing.assert_allclose(mech.nonprivate_projection(x), np.clip(x, LO, HI), atol=1e-15)
    assert (mech.transform, mech.k, mech.kept_coefficients) == ("identity", 20, 20)


def orthonormal_dft_coefficients(s: FloatArray, k: int) -> FloatArray:
    """c_0, a_1, b_1, ..., a_{k−1}, b_{k−1} from numpy.fft.rfft (docs/design.md's definition)."""
    n = s.shape[1]
    spec = np.fft.rfft(s, axis=1)[:, :k] / math.sqrt(n)
    out = np.empty((s.shape[0], 2 * k - 1))
    out[:, 0] = spec[:, 0].real
    out[:, 1::2] = math.sqrt(2) * spec[:, 1:].real
    out[:, 2::2] = math.sqrt(2) * spec[:, 1:].imag
    return out


@pytest.mark.parametrize(
    ("name", "transform"), [("cfpa", "dft"), ("cfpa", "dct"), ("dcfpa", "dft")]
)
def test_noise_on_kept_coefficients_has_the_reported_scale(name: str, transform: str) -> None:
    n, k, f = 32, 4, 400
    rng = np.random.default_rng(4)
    x = rng.uniform(LO, HI, (f, n))
    mech = make_mechanism(
        name, n=n, k=k, epsilon=2.0, bounds=Bounds(LO, HI, STEP), transform=transform, seed=11
    )
    s = x - LO
    if name == "dcfpa":
        s = np.diff(s, axis=1, prepend=0.0)
        s[:, 1:] = np.clip(s[:, 1:], -STEP, STEP)
    exact = (
        orthonormal_dft_coefficients(s, k)
        if transform == "dft"
        else scipy.fft.dct(s, norm="ortho", axis=1)[:, :k]
    )
    noise = np.concatenate([mech.release_coefficients(x) - exact for _ in range(100)])
    lam = mech.noise_scale[0]
    # Laplace(λ): E|Z| = λ and Var Z = 2λ²; 40 000 draws per coefficient column.
    np.testing.assert_allclose(np.mean(np.abs(noise), axis=0) / lam, 1.0, atol=0.02)
    np.testing.assert_allclose(np.var(noise, axis=0) / (2 * lam**2), 1.0, atol=0.05)
    assert abs(float(np.mean(noise))) < 0.02 * lam
    # Every released coefficient is an integer multiple of the power-of-two grid.
    released = mech.release_coefficients(x) / mech.grid[:, None]
    np.testing.assert_array_equal(released, np.rint(released))
    assert np.all(np.log2(mech.grid) == np.rint(np.log2(mech.grid)))


def privacy_loss_estimate(a: FloatArray, b: FloatArray, edges: FloatArray) -> tuple[float, float]:
    """Largest |log P_a(bin)/P_b(bin)| over bins with enough counts, and its standard error."""
    ca, _ = np.histogram(a, edges)
    cb, _ = np.histogram(b, edges)
    ok = (ca >= 200) & (cb >= 200)
    ratio = np.abs(np.log(ca[ok] / cb[ok]))
    se = np.sqrt(1 / ca[ok] + 1 / cb[ok])
    i = int(np.argmax(ratio))
    return float(ratio[i]), float(se[i])


@pytest.mark.parametrize(("name", "transform"), [("cfpa", "dft"), ("cfpa", "dct"), ("lpa", "")])
def test_privacy_loss_on_neighbouring_chunks_stays_below_epsilon(name: str, transform: str) -> None:
    """All-lo versus all-hi chunks (neighbours at maximal distance); the statistic is the mean of
    the published chunk, a post-processing whose loss can reach ε with k = 1 (CFPA) and LPA."""
    n, f, eps = 16, 4000, 1.0
    kw = {"transform": transform, "k": 1} if transform else {}
    outs = []
    for value, seed in ((LO, 5), (HI, 6)):
        mech = make_mechanism(
            name, n=n, epsilon=eps, bounds=Bounds(LO, HI), seed=seed, n_features=f, **kw
        )
        x = np.full((f, n), value)
        outs.append(np.concatenate([mech.release(x).mean(axis=1) for _ in range(25)]))
    edges = np.concatenate([[LO - 1, LO + 1e-9], np.linspace(LO + 0.05, HI - 0.05, 9), [HI]])
    edges = np.append(edges, HI + 1)
    loss, se = privacy_loss_estimate(outs[0], outs[1], np.unique(edges))
    assert loss <= eps + 4 * se, f"empirical privacy loss {loss:.3f} > ε = {eps}"
    if name == "cfpa":  # the bound is tight here: the test can see a too-small λ
        assert loss >= 0.8 * eps


def test_privacy_loss_dcfpa_below_epsilon() -> None:
    n, f, eps = 16, 4000, 0.5
    outs = []
    for value, seed in ((LO, 7), (HI, 8)):
        mech = make_mechanism(
            "dcfpa", n=n, k=2, epsilon=eps, bounds=Bounds(LO, HI, 1.0), seed=seed, n_features=f
        )
        outs.append(np.concatenate([mech.release(np.full((f, n), value))[:, 0] for _ in range(25)]))
    edges = np.unique(np.concatenate([[LO - 1, LO + 1e-9], np.linspace(LO + 0.1, HI, 9)]))
    loss, se = privacy_loss_estimate(outs[0], outs[1], np.append(edges, HI + 1))
    assert loss <= eps + 4 * se


def test_reported_parameters_follow_the_design_formulas() -> None:
    n, k = 64, 8
    lo = np.array([0.0, -5.0, 100.0])
    hi = np.array([1.0, 5.0, 400.0])
    d = np.array([0.05, 2.0, 1000.0])  # the last step exceeds R: R is used instead
    eps = np.array([0.5, 1.0, 4.8])
    bounds = Bounds(lo, hi, d)
    for name, transform, m in (("cfpa", "dft", 15), ("dcfpa", "dct", 8), ("fpa", "dft", 15)):
        mech = make_mechanism(name, n=n, k=k, epsilon=eps, bounds=bounds, transform=transform)
        r = hi - lo
        delta2 = (
            np.sqrt(r**2 + (n - 1) * (2 * np.minimum(d, r)) ** 2)
            if name == "dcfpa"
            else np.sqrt(n) * r
        )
        assert mech.kept_coefficients == m
        assert mech.k == k
        np.testing.assert_allclose(mech.sensitivity_l2, delta2)
        np.testing.assert_array_equal(mech.epsilon, eps)
        ideal = np.sqrt(m) * delta2 / eps
        # λ is the ideal √m·Δ2/ε, inflated (never deflated) to pay for the grid and sampler.
        assert np.all(mech.noise_scale >= ideal)
        np.testing.assert_allclose(mech.noise_scale, ideal, rtol=1e-3)
        params = mech.parameters()
        assert params["name"] == name
        assert params["secure"] is True
    np.testing.assert_allclose(raw_sensitivity_l2(bounds, n), np.sqrt(n) * (hi - lo))
    np.testing.assert_allclose(difference_sensitivity_l2(bounds, n)[0], math.sqrt(1 + 63 * 0.1**2))


def test_lpa_scale_is_l1_sensitivity_over_epsilon() -> None:
    mech = make_mechanism("lpa", n=10, epsilon=0.5, bounds=Bounds(0.0, 2.0), n_features=2)
    ideal = 10 * 2.0 / 0.5
    assert np.all(mech.noise_scale >= ideal)
    # λ = (Δ1 + 2·m·γ)/(ε − m·loss per coordinate): the grid, sampler and discrete-Laplace
    # charges (calibration.py); the slack each release is charged is exactly what ε leaves.
    budget = 0.5 - mech.sampler_slack
    np.testing.assert_allclose(mech.noise_scale, (20.0 + 2 * 10 * mech.grid) / budget, rtol=1e-12)
    assert np.all(mech.sampler_slack > 10 * SAMPLER_LOSS_PER_COORDINATE)
    assert np.all(mech.grid == 2.0**-15)  # the power of two just below λ·2^-20


def test_seeded_generator_is_reproducible_and_advances() -> None:
    x = np.zeros((5, 32))
    kw = {"n": 32, "k": 4, "epsilon": 1.0, "bounds": Bounds(-10.0, 10.0, 1.0)}
    a = make_mechanism("dcfpa", seed=123, **kw)
    b = make_mechanism("dcfpa", seed=123, **kw)
    first, second = a.release(x), a.release(x)
    assert not np.array_equal(first, second)  # fresh noise on every release
    np.testing.assert_array_equal(b.release(x), first)
    np.testing.assert_array_equal(b.release(x), second)
    assert not a.secure
    secure = make_mechanism("dcfpa", **kw)
    assert secure.secure
    assert not np.array_equal(secure.release(x), secure.release(x))


def test_noise_is_uncorrelated_across_releases() -> None:
    mech = make_mechanism("cfpa", n=32, k=3, epsilon=1.0, bounds=Bounds(0.0, 1.0), seed=9)
    x = np.full((200, 32), 0.5)
    exact = orthonormal_dft_coefficients(x, 3)
    noise = np.stack([mech.release_coefficients(x) - exact for _ in range(200)])
    corr = np.corrcoef(noise[:-1].ravel(), noise[1:].ravel())[0, 1]
    assert abs(corr) < 0.01  # 199 000 pairs: the standard error is 0.0022


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"epsilon": 0.0}, "epsilon", "0.0"),
        ({"epsilon": -1.0}, "epsilon", "-1.0"),
        ({"epsilon": math.nan}, "epsilon", "nan"),
        ({"epsilon": math.inf}, "epsilon", "inf"),
        ({"epsilon": [1.0, 0.0, 1.0]}, "epsilon", "0.0"),
        ({"n": 48}, "n", "48"),
        ({"n": 1}, "n", "1"),
        ({"k": 17}, "k", "17"),
        ({"k": 0}, "k", "0"),
        ({"k": True}, "k", "True"),
        ({"k": 33, "transform": "dct"}, "k", "33"),
        ({"transform": "fft"}, "transform", "'fft'"),
        ({"name": "gauss"}, "name", "'gauss'"),
        ({"bounds": Bounds(0.0, 1.0)}, "bounds.max_step", "None"),
        ({"seed": "abc"}, "seed", "'abc'"),
        ({"epsilon": [1.0, 1.0], "bounds": Bounds([0.0] * 3, 1.0, 0.1)}, "n_features", ""),
    ],
)
def test_bad_arguments_are_refused_naming_argument_and_value(
    kwargs: dict[str, object], field: str, value: str
) -> None:
    args: dict[str, object] = {
        "name": "dcfpa",
        "n": 32,
        "k": 4,
        "epsilon": 1.0,
        "bounds": Bounds(0.0, 1.0, 0.1),
        "transform": "dft",
    }
    args.update(kwargs)
    name = args.pop("name")
    with pytest.raises(ConfigError, match=f"'{field}'.*{value}".replace("(", r"\(")) as info:
        make_mechanism(str(name), **args)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(
    ("lo", "hi", "step", "field"),
    [
        (2.0, 1.0, 0.1, "bounds.lo"),
        (0.0, 1.0, 0.0, "bounds.max_step"),
        (0.0, 1.0, -1.0, "bounds.max_step"),
        (math.nan, 1.0, 0.1, "bounds.lo"),
        (0.0, math.inf, 0.1, "bounds.hi"),
        ([0.0, 0.0], [1.0, 1.0, 1.0], 0.1, "bounds"),
    ],
)
def test_bad_bounds_are_refused(lo: object, hi: object, step: object, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Bounds(lo, hi, step)  # type: ignore[arg-type]
    assert info.value.field == field


def test_bad_input_chunks_are_refused() -> None:
    mech = make_mechanism("cfpa", n=8, k=2, epsilon=1.0, bounds=Bounds(0.0, 1.0), n_features=2)
    with pytest.raises(ConfigError, match=r"'x'.*\(2, 7\)"):
        mech.release(np.zeros((2, 7)))
    with pytest.raises(ConfigError, match=r"'x'.*\(3, 8\).*F = 2"):
        mech.release(np.zeros((3, 8)))
    with pytest.raises(ConfigError, match=r"'x'.*\(8,\)"):
        mech.release(np.zeros(8))
    bad = np.zeros((2, 8))
    bad[1, 5] = np.nan
    with pytest.raises(ConfigError, match=r"1 NaN, first at \(feature 1, step 5\)"):
        mech.release(bad)
    with pytest.raises(ConfigError, match="'coefficients'"):
        mech.reconstruct(np.zeros((2, 4)))
    # ±inf is an out-of-bounds value like any other: clipped, not refused.
    inf = np.zeros((2, 8))
    inf[0, 0] = np.inf
    out = mech.release(inf)
    assert np.all((out >= 0.0) & (out <= 1.0))


def test_any_number_of_features_when_parameters_are_scalar() -> None:
    mech = make_mechanism("dcfpa", n=16, k=3, epsilon=1.0, bounds=Bounds(0.0, 1.0, 0.2))
    assert mech.n_features is None
    assert mech.noise_scale.shape == (1,)
    for f in (1, 4, 52):
        out = mech.release(np.full((f, 16), 0.5))
        assert out.shape == (f, 16)


def test_auto_k_comes_from_the_prior_not_the_data() -> None:
    bounds = Bounds(0.0, 1.0, 1 / 30)
    kw = {"n": 64, "k": "auto", "bounds": bounds, "n_features": 2}
    for name in ("cfpa", "dcfpa", "fpa"):
        for transform in ("dft", "dct"):
            low = make_mechanism(name, epsilon=0.48, transform=transform, **kw)
            high = make_mechanism(name, epsilon=4800.0, transform=transform, **kw)
            assert 1 <= low.k <= high.k  # more budget never buys fewer coefficients
            assert high.k > 1
            expected = choose_k(name, 64, transform, bounds.broadcast(2), np.full(2, 4800.0))
            assert high.k == expected


def test_dcfpa_expected_error_is_the_noise_pushed_through_the_cumsum() -> None:
    """With a prior of zero signal only the perturbation error remains; for DCFPA it must equal a
    Monte Carlo of Laplace noise on the kept coefficients, inverted and cumulatively summed —
    far above docs/design.md's 2·m·λ²/n, which holds for CFPA."""
    zero = PriorSpectrum(mean=0.0, variance=0.0, autocorrelation=np.ones(1))
    n, f = 32, 1
    bounds = Bounds(0.0, 1.0, 0.1).broadcast(f)
    eps = np.array([1.0])
    ks, mse = expected_mse("dcfpa", n, "dft", bounds, eps, prior=zero)
    _, mse_raw = expected_mse("cfpa", n, "dft", bounds, eps, prior=zero)
    rng = np.random.default_rng(12)
    for k in (1, 3, 8):
        mech = make_mechanism("dcfpa", n=n, k=k, epsilon=eps, bounds=bounds, transform="dft")
        lam = mech.noise_scale[0]
        m = mech.kept_coefficients
        noise = rng.laplace(0.0, lam, (20000, m))
        full = np.zeros((20000, n))
        full[:, :m] = noise
        walk = np.cumsum(inverse(full, "dft"), axis=1)
        np.testing.assert_allclose(np.mean(walk**2), mse[k - 1, 0], rtol=0.05)
        assert mse[k - 1, 0] > 5 * 2 * m * lam**2 / n
        raw = make_mechanism("cfpa", n=n, k=k, epsilon=eps, bounds=bounds, transform="dft")
        np.testing.assert_allclose(mse_raw[k - 1, 0], 2 * m * raw.noise_scale[0] ** 2 / n)
    assert ks[0] == 1


def test_shipped_prior_tables_match_the_model() -> None:
    prior = default_prior()
    doc = json.loads(DEFAULT_PATH.read_text())
    for transform in ("dft", "dct"):
        for n in (32, 64, 128):
            table = doc["spectra"][transform][str(n)]
            raw = prior.raw_energy(n, transform)
            np.testing.assert_allclose(table["raw"], raw, rtol=1e-5, atol=1e-9)
            diff = np.diag(prior.difference_covariance(n, transform))
            np.testing.assert_allclose(table["difference"], diff, rtol=1e-5, atol=1e-9)
            # Parseval: the energies add up to E‖z‖² = n·(mean² + variance).
            np.testing.assert_allclose(raw.sum(), n * (prior.mean**2 + prior.variance))
            assert np.all(raw > -1e-12)


def test_estimate_prior_recovers_a_known_process() -> None:
    rng = np.random.default_rng(13)
    rho, t_len = 0.9, 4000
    recs = []
    for _ in range(6):
        e = rng.normal(0, math.sqrt(1 - rho**2), (3, t_len))
        x = np.empty_like(e)
        x[:, 0] = rng.normal(0, 1, 3)
        for t in range(1, t_len):
            x[:, t] = rho * x[:, t - 1] + e[:, t]
        recs.append(10.0 + 0.5 * x)  # mean 10, std 0.5, in bounds [8, 12]
    recs[0][1, 7] = np.nan  # that series is skipped
    prior = estimate_prior(recs, lo=8.0, hi=12.0, max_lag=64)
    assert abs(prior.mean - 0.5) < 0.02
    assert abs(math.sqrt(prior.variance) - 0.125) < 0.01
    np.testing.assert_allclose(prior.autocorrelation[:4], rho ** np.arange(4), atol=0.03)
    assert "1 series with NaN skipped" in prior.source


def test_prior_cli_writes_and_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prior.json"
    assert prior_main(["model", "--out", str(out)]) == 0
    assert PriorSpectrum.load(out).variance == pytest.approx(0.17**2)
    assert prior_main(["show", "--prior", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dcfpa dct  128" in text
    table = FeatureTable(
        X=np.random.default_rng(1).uniform(0, 1, (300, 2)),
        t=np.arange(300) * 0.5,
        person=np.array(["p"] * 300),
        task=np.array(["t"] * 300),
        recording=np.array(["r1"] * 150 + ["r2"] * 150),
        feature_names=("a", "b"),
    )
    bounds = tmp_path / "bounds.json"
    bounds.write_text(json.dumps({"a": {"lo": 0, "hi": 1}, "b": {"lo": 0, "hi": 2}}))
    data = table.save(tmp_path / "t.npz")
    est = tmp_path / "est.json"
    assert prior_main(["estimate", str(data), "--bounds", str(bounds), "--out", str(est)]) == 0
    prior = PriorSpectrum.load(est)
    assert 0.3 < prior.mean < 0.45  # feature b uses half its range: mean (0.5 + 0.25)/2
    bounds.write_text(json.dumps({"a": {"lo": 0, "hi": 1}}))
    with pytest.raises(DatasetError, match=r"bounds\.json"):
        prior_main(["estimate", str(data), "--bounds", str(bounds), "--out", str(est)])


def test_plans_are_built_once_and_reused() -> None:
    mech = make_mechanism("cfpa", n=128, k=3, epsilon=1.0, bounds=Bounds(0.0, 1.0), n_features=13)
    built = tr_mod.plans_built
    for _ in range(5):
        mech.release(np.zeros((13, 128)))
    twin = make_mechanism(
        "dcfpa", n=128, k=5, epsilon=2.0, bounds=Bounds(0.0, 1.0, 0.1), n_features=13
    )
    twin.release(np.zeros((13, 128)))
    assert tr_mod.plans_built == built  # no planning in release; same shape, same plans
    # A mechanism whose F is only known at its first release plans then, once.
    lazy = make_mechanism("cfpa", n=64, k=2, epsilon=1.0, bounds=Bounds(0.0, 1.0))
    lazy.release(np.zeros((11, 64)))
    after_first = tr_mod.plans_built
    lazy.release(np.zeros((11, 64)))
    assert tr_mod.plans_built == after_first


def test_wisdom_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "wisdom.json"
    make_mechanism("cfpa", n=32, k=2, epsilon=1.0, bounds=Bounds(0.0, 1.0), n_features=3)
    save_wisdom(path)
    assert load_wisdom(path)
    assert not load_wisdom(path.with_name("missing.json"))
    path.write_text("{}")
    with pytest.raises(ConfigError, match="fftw_wisdom"):
        load_wisdom(path)


def test_package_docstring_example_runs() -> None:
    result = doctest.testmod(mechanisms_package, verbose=False)
    assert result.attempted >= 3
    assert result.failed == 0
