"""The mechanism registry: one place that every other module reads names and rules from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from gazeguard.config import FeatureSettings, MechanismSettings, load_settings
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import Ledger
from gazeguard.privacy.mechanisms import (
    MECHANISMS,
    NOISE,
    ONLINE_MECHANISMS,
    Bounds,
    make_mechanism,
    mechanism_kind,
)
from gazeguard.runtime.pipeline import Pipeline
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.wire.message import MechanismParams, shipped_schema

NAMES = ["fixation_rate", "saccade_rate", "pupil_mean"]
FAST = FeatureSettings(window_s=2.0, step_s=0.05)


def test_every_online_mechanism_is_accepted_by_config_cli_schema_and_messages() -> None:
    schema = shipped_schema("chunk.schema.json")
    enum = schema["$defs"]["MechanismParams"]["properties"]["name"]["enum"]
    assert enum == list(ONLINE_MECHANISMS)
    assert set(ONLINE_MECHANISMS) == {k for k, v in MECHANISMS.items() if v.online}
    for name in ONLINE_MECHANISMS:
        assert MechanismSettings(name=name).name == name
    for noise in NOISE:
        assert MechanismSettings(noise=noise).noise == noise


def test_an_unknown_or_offline_mechanism_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"mechanism\.name.*'lpa', 'cfpa', 'dcfpa'"):
        load_settings(mechanism={"name": "dcfpa2"})
    with pytest.raises(ConfigError, match="whole recordings"):
        load_settings(mechanism={"name": "fpa"})
    with pytest.raises(ConfigError, match=r"mechanism\.noise"):
        load_settings(mechanism={"noise": "cauchy"})
    with pytest.raises(ConfigError, match="must be one of"):
        mechanism_kind("nope")


def test_a_dct_configuration_with_k_above_n_over_2_runs_end_to_end(tmp_path: Path) -> None:
    # The message model used to refuse k > n/2 for every transform while the mechanism allows
    # k up to n for the DCT: a valid configuration failed as a pydantic error in the pipeline.
    settings = MechanismSettings.model_validate(
        {"features": NAMES, "epsilon": 40.0, "transform": "dct", "k": 12, "chunk_steps": 16}
    )
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = Pipeline(
            ledger, session="s", device="d", rate_hz=120.0, features=FAST, mechanism=settings
        )
        gaze = simulate_gaze(6.0, 120.0, 1)
        out = [c for s in range(0, len(gaze), 12) for c in pipe.push(gaze.slice(s, s + 12))]
    assert out
    assert out[0].message.mechanism.k == 12
    assert out[0].message.mechanism.m == 12
    with pytest.raises(ValidationError, match="exceeds n/2=8"):
        MechanismParams.model_validate(
            {**out[0].message.mechanism.model_dump(by_alias=True), "transform": "dft", "m": 23}
        )


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_the_message_parameters_are_the_mechanisms_own(name: str) -> None:
    kind = MECHANISMS[name]
    mech = make_mechanism(
        name, n=32, k=3, epsilon=2.0, bounds=Bounds(0.0, 1.0, 0.1), transform="dct", n_features=2
    )
    assert mech.kind is kind
    assert mech.kept_coefficients == kind.kept("dct", mech.k, 32)
    if not kind.online:
        return
    params = MechanismParams.from_mechanism(mech)
    assert params.m == mech.kept_coefficients
    assert params.k == (3 if kind.transformed else None)
    assert params.transform == ("dct" if kind.transformed else None)
    np.testing.assert_allclose(params.noise_scale, mech.noise_scale)
    np.testing.assert_allclose(params.sensitivity, mech.sensitivity)
    np.testing.assert_allclose(params.noise_multiplier, mech.noise_multiplier)


def test_a_noise_multiplier_gives_the_pure_epsilon_it_implies() -> None:
    b = Bounds(0.0, 1.0, 0.05)
    by_eps = make_mechanism("dcfpa", n=32, k=2, epsilon=0.5, bounds=b, n_features=3)
    by_ratio = make_mechanism(
        "dcfpa", n=32, k=2, noise_multiplier=by_eps.noise_multiplier, bounds=b, n_features=3
    )
    np.testing.assert_allclose(by_ratio.noise_scale, by_eps.noise_scale, rtol=1e-12)
    # from a multiplier, the discrete Laplace's slack is charged at the grid's least t (a bound
    # that does not move with the noise): a hair above the ε the calibration paid exactly
    assert np.all(by_ratio.epsilon >= 0.5)
    np.testing.assert_allclose(by_ratio.epsilon, 0.5, rtol=1e-6)
    with pytest.raises(ConfigError, match="exactly one"):
        make_mechanism("cfpa", n=32, k=1, bounds=b, n_features=3)
