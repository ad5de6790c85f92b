"""Private labels: budget arithmetic, exact randomized response (against the pmf and OpenDP), the
JSON model format (round trip, refusals), the release and the label message schema."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.randomness import InsecureSeededRandom, OsRandom
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import NAMES
from gazeguard.signal.labels import (
    MODEL_FORMAT,
    LabelModel,
    LabelRelease,
    RandomizedResponse,
    epsilon_for_survival,
    load_model,
    release_label,
    released_accuracy,
    rr_weights,
    survival_probability,
    train_model,
    uniform_below,
)
from gazeguard.signal.profiles import load_profile
from gazeguard.wire.kinds import LABELS
from gazeguard.wire.label import LABEL_SCHEMA, LabelMessage
from gazeguard.wire.topics import label_topic

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- budget arithmetic
def test_issue_numbers_by_hand() -> None:
    # 6 classes, ε = 3: e^3 = 20.0855; 20.0855 / 25.0855 = 0.8007.
    assert survival_probability(3.0, 6) == pytest.approx(20.085536923 / 25.085536923, abs=1e-9)
    assert round(survival_probability(3.0, 6), 2) == 0.80
    # p = 0.8 over 6 classes needs ε = ln(0.8·5/0.2) = ln 20 = 2.9957; over 3, ln 8 = 2.079.
    assert epsilon_for_survival(0.8, 6) == pytest.approx(math.log(20.0))
    assert epsilon_for_survival(0.8, 3) == pytest.approx(math.log(8.0))
    # At ε = 5/6: p = e^(5/6)/(e^(5/6) + 5) = 2.3010/7.3010 = 0.3152; with clean accuracy 0.56
    # the released label is right with 0.3152·0.56 + 0.6848·0.44/5 = 0.2368 (42 % of clean).
    p = survival_probability(5 / 6, 6)
    assert p == pytest.approx(2.30097589 / 7.30097589, abs=1e-8)
    assert released_accuracy(0.56, p, 6) == pytest.approx(
        0.31516 * 0.56 + 0.68484 * 0.44 / 5, abs=1e-4
    )


def test_released_accuracy_edges() -> None:
    assert released_accuracy(1.0, 0.8, 6) == pytest.approx(0.8)
    assert released_accuracy(0.0, 0.8, 6) == pytest.approx(0.2 / 5)
    # A classifier at chance stays at chance whatever the survival.
    assert released_accuracy(1 / 6, 0.37, 6) == pytest.approx(1 / 6)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 20.0), st.integers(2, 50))
def test_epsilon_for_survival_inverts_survival(eps: float, classes: int) -> None:
    p = survival_probability(eps, classes)
    if p < 1.0 - 1e-12:
        assert epsilon_for_survival(p, classes) == pytest.approx(eps, rel=1e-6)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: survival_probability(0.0, 6), "epsilon"),
        (lambda: survival_probability(float("nan"), 6), "epsilon"),
        (lambda: survival_probability(1.0, 1), "classes"),
        (lambda: epsilon_for_survival(1 / 6, 6), "survival"),
        (lambda: epsilon_for_survival(1.0, 6), "survival"),
    ],
)
def test_bad_arithmetic_inputs_are_refused(call: object, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        call()  # type: ignore[operator]
    assert err.value.field == field


# ----------------------------------------------------------------------------- exact sampling
class ExhaustedError(Exception):
    """Every byte value has been handed out."""


class EnumeratingBytes:
    """Deterministic 'random' bytes: one pass over the byte values 0, 1, …, 255, then
    :class:`ExhaustedError`."""

    secure = False

    def __init__(self) -> None:
        self.next = 0

    def bytes(self, n: int) -> bytes:
        assert n == 1, "these tests use ranges below 256"
        if self.next == 256:
            raise ExhaustedError
        self.next += 1
        return bytes([self.next - 1])


def _all_draws(draw: Callable[[EnumeratingBytes], int]) -> Counter[int]:
    """What ``draw`` returns over one pass of all byte values (an unfinished draw is dropped)."""
    src = EnumeratingBytes()
    out: Counter[int] = Counter()
    with contextlib.suppress(ExhaustedError):
        while True:
            out[draw(src)] += 1
    return out


@given(st.integers(2, 256))
def test_uniform_below_is_exactly_uniform(n: int) -> None:
    # Over one pass of all 256 byte values, every value below n is accepted equally often.
    counts = _all_draws(lambda src: uniform_below(n, src))
    assert set(counts) == set(range(n))
    assert set(counts.values()) == {256 >> (n - 1).bit_length()}


def test_uniform_below_one_reads_nothing() -> None:
    src = EnumeratingBytes()
    assert uniform_below(1, src) == 0
    assert src.next == 0


@settings(max_examples=300, deadline=None)
@given(st.floats(2.0**-30, 50.0))
def test_weights_bound_the_likelihood_ratio_rigorously(eps: float) -> None:
    a, b = rr_weights(eps)
    with localcontext() as ctx:
        ctx.prec = 200
        exact = Decimal(eps).exp()
        ratio = Decimal(a) / Decimal(b)
        assert ratio < exact  # the realized mechanism is never less private than charged
        assert exact - ratio < Decimal(3) / Decimal(b)


def test_release_maps_every_integer_to_the_right_class() -> None:
    # Small weights so one pass over the bytes enumerates every U exactly: a = 5, b = 2, C = 3
    # (total 9, 4 bits): U 0..4 -> true class, 5..6 -> first other, 7..8 -> second other.
    rr = RandomizedResponse(3, 1.0)
    rr.weight_true, rr.weight_other, rr._total = 5, 2, 9
    for true in range(3):
        counts = _all_draws(lambda src, t=true: rr.release(t, src))
        others = [j for j in range(3) if j != true]
        assert counts[true] == 5 * 16
        assert counts[others[0]] == counts[others[1]] == 2 * 16


@pytest.mark.parametrize(("classes", "eps"), [(2, 0.5), (6, 3.0), (6, 0.1), (12, 2.0)])
def test_pmf_is_exact_randomized_response(classes: int, eps: float) -> None:
    rr = RandomizedResponse(classes, eps)
    pmf = rr.pmf(1)
    assert sum(pmf) == 1
    assert pmf[1] / pmf[0] == Fraction(rr.weight_true, rr.weight_other)
    with localcontext() as ctx:
        ctx.prec = 100
        e = Decimal(eps).exp()
        ideal = e / (e + classes - 1)
        realized = Decimal(pmf[1].numerator) / Decimal(pmf[1].denominator)
        assert Decimal(0) < ideal - realized < Decimal(2) ** -62
    assert float(pmf[1]) == pytest.approx(survival_probability(eps, classes), rel=1e-15)
    assert rr.survival <= survival_probability(eps, classes) + 1e-15
    assert rr.epsilon_realized <= eps


def _chi2_against(pmf: tuple[Fraction, ...], draws: list[int]) -> float:
    counts = np.bincount(draws, minlength=len(pmf))
    expected = np.array([float(p) for p in pmf]) * len(draws)
    return float(stats.chisquare(counts, expected).pvalue)


def test_seeded_draws_match_the_exact_pmf() -> None:
    rr = RandomizedResponse(6, 3.0)
    src = InsecureSeededRandom(2024)
    draws = [rr.release(2, src) for _ in range(60_000)]
    assert _chi2_against(rr.pmf(2), draws) > 1e-4  # deterministic: fixed seed


def test_os_csprng_draws_match_the_exact_pmf() -> None:
    rr = RandomizedResponse(4, 1.0)
    draws = [rr.release(0, OsRandom()) for _ in range(40_000)]
    # Fresh OS randomness: a correct sampler fails this with probability 1e-7.
    assert _chi2_against(rr.pmf(0), draws) > 1e-7


@pytest.mark.slow
def test_matches_opendp_randomized_response() -> None:
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    classes, eps, true, n = 6, 1.5, 3, 20_000
    rr = RandomizedResponse(classes, eps)
    meas = dp.m.make_randomized_response(categories=list(range(classes)), prob=rr.survival)
    # OpenDP's privacy map agrees with our ε (it rounds up; ours is realized ≤ ε).
    assert meas.map(1) == pytest.approx(eps, abs=1e-9)
    theirs = [int(meas(true)) for _ in range(n)]
    src = InsecureSeededRandom(7)
    ours = [rr.release(true, src) for _ in range(n)]
    # Each against the exact pmf, and the two samples against each other (homogeneity).
    assert _chi2_against(rr.pmf(true), theirs) > 1e-7
    assert _chi2_against(rr.pmf(true), ours) > 1e-4
    table = np.vstack(
        [np.bincount(ours, minlength=classes), np.bincount(theirs, minlength=classes)]
    )
    assert stats.chi2_contingency(table).pvalue > 1e-7
    # And a wrong mechanism is caught by the same test at this sample size: reporting the true
    # label with the survival of C + 1 classes.
    wrong = RandomizedResponse(classes + 1, eps)
    bad = [min(wrong.release(true, src), classes - 1) for _ in range(n)]
    assert _chi2_against(rr.pmf(true), bad) < 1e-7


def test_randomized_response_refuses_bad_parameters() -> None:
    with pytest.raises(ConfigError):
        RandomizedResponse(1, 1.0)
    with pytest.raises(ConfigError):
        RandomizedResponse(3, 51.0)
    with pytest.raises(ValueError, match=r"not in 0\.\.2"):
        RandomizedResponse(3, 1.0).release(3)


# ----------------------------------------------------------------------------- model format
FEATS = ("saccade_right_ratio", "fixation_duration_var", "wordbook1_distinct")


def _table(seed: int = 0, people: int = 4, steps: int = 40) -> FeatureTable:
    """Three tasks that shift the features' means, people that shift them less."""
    rng = np.random.default_rng(seed)
    tasks = ("read", "search", "watch")
    X, person, task = [], [], []
    for p in range(people):
        offset = rng.normal(0, 0.3, len(NAMES))
        for j, t in enumerate(tasks):
            base = np.zeros(len(NAMES))
            base[NAMES.index(FEATS[0])] = 0.2 + 0.25 * j
            base[NAMES.index(FEATS[1])] = 0.05 * (2 - j)
            base[NAMES.index(FEATS[2])] = 4.0 + 3 * j
            X.append(base + 0.1 * offset + rng.normal(0, 0.05, (steps, len(NAMES))))
            person += [f"p{p}"] * steps
            task += [t] * steps
    person_a = np.array(person)
    task_a = np.array(task)
    return FeatureTable(
        np.vstack(X),
        np.tile(np.arange(steps) * 0.5, people * len(tasks)),
        person_a,
        task_a,
        np.char.add(np.char.add(person_a, "_"), task_a),
        NAMES,
    )


@pytest.fixture(scope="module")
def model() -> LabelModel:
    return train_model(_table(), FEATS, name="toy", version="1", profile="toy")


def test_model_round_trip_and_numpy_inference_matches_sklearn(
    model: LabelModel, tmp_path: Path
) -> None:
    path = model.save(tmp_path / "m.json")
    data = json.loads(path.read_text())
    assert data["format"] == MODEL_FORMAT
    assert data["features"] == list(FEATS)
    assert data["classes"] == ["read", "search", "watch"]
    loaded = load_model(path)
    t = _table(seed=1)
    X = t.X[:, [NAMES.index(f) for f in FEATS]]
    assert np.array_equal(loaded.predict_proba(X), model.predict_proba(X))
    # The exported coefficients are scikit-learn's model: same probabilities.
    train = _table()
    Xtr = train.X[:, [NAMES.index(f) for f in FEATS]]
    mu, sd = Xtr.mean(0), Xtr.std(0)
    ref = LogisticRegression(C=1.0, max_iter=5000).fit((Xtr - mu) / sd, train.task)
    assert np.allclose(loaded.predict_proba(X), ref.predict_proba((X - mu) / sd), atol=1e-9)
    acc = np.mean(np.asarray(loaded.classes)[loaded.predict_proba(X).argmax(1)] == t.task)
    assert acc > 0.9


@pytest.mark.parametrize("tasks", [("read", "search", "watch"), ("read", "watch")])
def test_an_mlp_model_file_gives_scikit_learns_probabilities(
    tasks: tuple[str, ...], tmp_path: Path
) -> None:
    train = _table()
    keep = np.isin(train.task, tasks)
    train = FeatureTable(
        train.X[keep], train.t[keep], train.person[keep], train.task[keep],
        train.recording[keep], NAMES,
    )  # fmt: skip
    mlp_model = train_model(train, FEATS, name="toy-mlp", hidden_layers=(6, 4), regularization=2.0)
    data = json.loads(mlp_model.save(tmp_path / "m.json").read_text())
    assert data["classifier"]["kind"] == "mlp-softmax"
    assert [len(h["intercept"]) for h in data["classifier"]["hidden"]] == [6, 4]
    loaded = load_model(tmp_path / "m.json")
    # the same fit by scikit-learn (same rows, seed and settings): the file's numpy inference
    # gives its probabilities, the binary case (one logistic output) included
    Xtr = train.X[:, [NAMES.index(f) for f in FEATS]]
    mu, sd = Xtr.mean(0), Xtr.std(0)
    ref = MLPClassifier((6, 4), alpha=0.5, max_iter=300, early_stopping=True, random_state=0)
    ref.fit((Xtr - mu) / sd, train.task)
    assert list(ref.classes_) == list(loaded.classes) == sorted(tasks)
    t = _table(seed=1)
    X = t.X[:, [NAMES.index(f) for f in FEATS]]
    assert np.allclose(loaded.predict_proba(X), ref.predict_proba((X - mu) / sd), atol=1e-9)
    assert "MLPClassifier" in loaded.spec.trained["estimator"]


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        (lambda c: c.pop("hidden"), "classifier", "at least one hidden layer"),
        (lambda c: c.__setitem__("kind", "linear-softmax"), "classifier", "has none, got 1"),
        (lambda c: c["hidden"][0]["coef"][0].pop(), "classifier.hidden.0.coef",
         "must be [H][input] = [5][3]"),
        (lambda c: c["coef"][1].append(0.0), "classifier.coef", "must be [C][H] = [3][5]"),
        (lambda c: c["hidden"][0]["intercept"].__setitem__(2, float("inf")),
         "classifier.hidden.0.intercept.2", "finite"),
    ],
)  # fmt: skip
def test_malformed_mlp_models_are_refused_naming_the_field(
    tmp_path: Path, edit: object, field: str, reason: str
) -> None:
    d = json.loads(train_model(_table(), FEATS, name="m", hidden_layers=(5,)).to_json())
    edit(d["classifier"])  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as err:
        load_model(path)
    assert err.value.field.startswith(field), err.value
    assert reason in str(err.value)


def test_model_refuses_a_profile_with_other_features(model: LabelModel, tmp_path: Path) -> None:
    path = model.save(tmp_path / "m.json")
    profile = load_profile("activity")
    with pytest.raises(ConfigError) as err:
        load_model(path, profile=profile)
    msg = str(err.value)
    assert "reads features ['saccade_right_ratio'" in msg
    assert f"profile 'activity' releases {profile.features}" in msg


def _model_dict(model: LabelModel) -> dict[str, object]:
    return json.loads(model.to_json())  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        (lambda d: d["features"].__setitem__(1, "fixation_duraton_var"), "features[1]",
         "did you mean 'fixation_duration_var'"),
        (lambda d: d["classifier"]["coef"][0].pop(), "classifier.coef", "must be [C][F] = [3][3]"),
        (lambda d: d["standardizer"]["scale"].__setitem__(0, 0.0), "standardizer.scale.0",
         "greater than 0"),
        (lambda d: d.__setitem__("format", "pickle"), "format", "gazeguard.label-model/1"),
        (lambda d: d.__setitem__("__reduce__", "os.system"), "__reduce__", "Extra inputs"),
        (lambda d: d["classes"].__setitem__(1, "read"), "classes", "duplicate names: ['read']"),
        (lambda d: d["classifier"]["intercept"].__setitem__(0, float("nan")),
         "classifier.intercept.0", "finite"),
    ],
)  # fmt: skip
def test_malformed_models_are_refused_naming_the_field(
    model: LabelModel, tmp_path: Path, edit: object, field: str, reason: str
) -> None:
    d = _model_dict(model)
    edit(d)  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))  # NaN is written as the (non-standard) JSON token NaN
    with pytest.raises(ConfigError) as err:
        load_model(path)
    assert err.value.field.startswith(field), err.value
    assert reason in str(err.value)
    assert str(path) in str(err.value)


def test_model_file_errors_name_file_line_and_alternatives(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "gazeguard.label-model/1",\n "name": }')
    with pytest.raises(ConfigError, match=r"line 2, column 10.*not JSON"):
        load_model(bad)
    with pytest.raises(ConfigError, match="file not found"):
        load_model(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="did you mean 'activity'"):
        load_model("activty")


def test_shipped_activity_model_matches_the_shipped_profile() -> None:
    """The model decides the profile's task. It reads every feature that varies in the build
    data, not only the two the profile's chunk stream releases: only its label is released."""
    profile = load_profile("activity")
    m = load_model("activity")
    assert m.spec.profile == profile.name
    assert set(profile.features) <= set(m.features)
    assert (m.spec.window_s, m.spec.step_s) == (profile.built["window_s"], profile.built["step_s"])
    assert sorted(m.classes) == sorted(profile.classes)
    with pytest.raises(ConfigError, match="has extra"):
        load_model("activity", profile=profile)  # a model held to the released features
    assert m.spec.gazeguard_version
    assert 0.0 < m.spec.trained["lopo_window_accuracy"] <= 1.0


def test_docs_model_format_example_loads(tmp_path: Path) -> None:
    docs = (REPO / "docs" / "releases.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", docs, re.S)
    examples = [b for b in blocks if '"gazeguard.label-model/1"' in b]
    assert examples, "docs/releases.md documents the model format with a JSON example"
    path = tmp_path / "consumer.json"
    path.write_text(examples[0])
    m = load_model(path)
    probs = m.predict_proba(np.zeros((1, len(m.features))))
    assert probs.shape == (1, len(m.classes))


# ----------------------------------------------------------------------------- the release
def test_label_release_decides_on_the_mean_probability_then_randomizes(model: LabelModel) -> None:
    t = _table(seed=3)
    rows = np.flatnonzero(t.recording == "p0_watch")[:20]
    window = t.X[rows]  # full 48-feature vectors
    lr = LabelRelease(model, 2.0, input_features=NAMES, source=InsecureSeededRandom(5))
    assert lr.classes == ("read", "search", "watch")
    assert lr.survival == pytest.approx(survival_probability(2.0, 3), abs=1e-15)
    counts = Counter(lr.release(window).label for _ in range(6000))
    # The clean decision is "watch": it survives with p, each other label with (1 − p)/2.
    p = lr.rr.pmf(2)
    pval = stats.chisquare(
        [counts["read"], counts["search"], counts["watch"]], [float(q) * 6000 for q in p]
    ).pvalue
    assert pval > 1e-4
    d = lr.release(window)
    assert d.epsilon == 2.0
    assert d.mechanism == "randomized_response"
    assert d.noise == "INSECURE-seeded"
    assert d.vectors == 20
    assert not hasattr(d, "clean")


def test_release_label_is_a_pure_function_of_its_inputs(model: LabelModel) -> None:
    X = _table(seed=4).X[:10][:, [NAMES.index(f) for f in FEATS]]
    a = [release_label(X, model, 1.0, InsecureSeededRandom(9)).label for _ in range(5)]
    b = [release_label(X, model, 1.0, InsecureSeededRandom(9)).label for _ in range(5)]
    assert a == b
    assert release_label(X, model, 1.0).noise == "os-csprng"


def test_release_refuses_vectors_without_the_model_features(model: LabelModel) -> None:
    with pytest.raises(ConfigError, match="wordbook1_distinct"):
        LabelRelease(model, 1.0, input_features=FEATS[:2])
    lr = LabelRelease(model, 1.0)
    with pytest.raises(ValueError, match="T >= 1"):
        lr.release(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="finite"):
        lr.release(np.full((2, 3), np.nan))


# ----------------------------------------------------------------------------- the message
def _message(model: LabelModel, **over: object) -> LabelMessage:
    decision = LabelRelease(model, 3.0, source=InsecureSeededRandom(1)).release(
        np.zeros((4, len(FEATS)))
    )
    kw: dict[str, object] = {
        "session": "s1",
        "device": "hmd-1",
        "decision_index": 0,
        "window_start": 100.0,
        "window_end": 130.0,
        "model_name": model.name,
        "model_version": model.version,
        "profile": "toy",
    }
    kw.update(over)
    return LabelMessage.build(decision, **kw)  # type: ignore[arg-type]


def test_label_message_round_trip_and_schema(model: LabelModel) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    msg = _message(model)
    payload = msg.to_payload()
    data = json.loads(payload)
    assert data["schema"] == LABEL_SCHEMA
    assert data["mechanism"] == "randomized_response"
    assert set(data) == {
        "schema", "session", "device", "decision_index", "window_start", "window_end", "label",
        "classes", "epsilon", "mechanism", "survival_probability", "model", "profile", "noise",
        "release", "clean_accuracy", "unix_end",
    }  # fmt: skip
    assert LabelMessage.from_payload(payload) == msg
    schema = LABELS.shipped_schema()
    assert schema == json.loads(json.dumps(LABELS.json_schema())), (
        "label.schema.json is stale: gazeguard schemas --write"
    )
    jsonschema.validate(data, schema)
    for bad in ({**data, "label": "dance"}, {**data, "extra": 1}, {**data, "epsilon": -1}):
        with pytest.raises(ValueError):  # pydantic.ValidationError is a ValueError
            LabelMessage.model_validate(bad)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data, "extra": 1}, schema)


def test_a_label_states_its_probability_of_being_right_as_the_plan_does(
    model: LabelModel,
) -> None:
    msg = _message(model, clean_accuracy=0.7, unix_end=1.7e9)
    c = len(msg.classes)
    assert msg.right_probability == pytest.approx(
        released_accuracy(0.7, survival_probability(3.0, c), c), rel=1e-12
    )
    assert _message(model).right_probability is None  # a message that does not say
    with pytest.raises(ValueError, match="less than or equal to 1"):
        _message(model, clean_accuracy=1.2)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("survival_probability", 0.5, "keeps the true label with"),
        ("label", "dance", "not one of the classes"),
        ("window_end", 90.0, "must be after window_start"),
        ("classes", ["read", "read", "watch"], "unique"),
    ],
)
def test_label_message_refuses_inconsistent_fields(
    model: LabelModel, field: str, value: object, match: str
) -> None:
    data = json.loads(_message(model).to_payload())
    data[field] = value
    with pytest.raises(ValueError, match=match):
        LabelMessage.model_validate(data)


def test_label_topic() -> None:
    assert label_topic("gazeguard/v1", "hmd-1", "s1") == "gazeguard/v1/hmd-1/s1/labels"
    with pytest.raises(ConfigError):
        label_topic("gazeguard/v1", "hmd/1", "s1")
