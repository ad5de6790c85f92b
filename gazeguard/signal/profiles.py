"""Release profiles: the few features a consumer's task needs, chosen on labelled public data.

A profile is a named JSON file (``gazeguard/data/profiles/NAME.json``, or any path) that lists
the features a consumer receives, with a suggested budget and a record of how it was built.
:func:`load_profile` loads and validates one; ``gazeguard profile build`` makes one with
:func:`build_profile`, from **labelled public recordings only — never the user's data**: the
choice of features is itself a release about the data it was made from.

How profiles are built (on public data, offline) is :mod:`gazeguard.offline.profiles`.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from gazeguard.core.version import __version__
from gazeguard.signal.files import check_feature_names, read_named_json, validation_error

PROFILE_SCHEMA: Final = "gazeguard.profile/1"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

Name = Annotated[str, Field(min_length=1, max_length=200)]
Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


def unique_names(names: list[str], message: str) -> list[str]:
    """``names`` unchanged, a validator's check that none repeats.

    Raises:
        ValueError: ``"{message}: {the repeated names, sorted}"``.
    """
    dup = sorted({f for f in names if names.count(f) > 1})
    if dup:
        msg = f"{message}: {dup}"
        raise ValueError(msg)
    return names


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SuggestedBudget(_Strict):
    """What releasing the profile costs at the noise level it was built for.

    Attributes:
        per_hour: user-level ε at ``delta`` per hour of gaze (what ``ledger.budget_per_hour``
            would have to be for this noise): the privacy-loss-distribution composition of
            ``features × chunks_per_hour`` Laplace releases at ``epsilon_per_feature_per_chunk``
            each (:func:`gazeguard.offline.profiles.suggested_budget`).
        epsilon_per_feature_per_chunk: ε of each released feature in each chunk.
        mechanism: the stream mechanism, e.g. ``cfpa-32-dct``.
        chunk_steps: n, steps per chunk; step_s: seconds per step.
        chunks_per_hour: chunks whose gaze end can fall in one hour, ``⌈3600/(n·step_s)⌉ + 1``
            (as the ledger's budget counts them).
        delta: δ of ``per_hour`` (``None``: a file of the old pure-ε format).
        pure_per_hour: the same hour under pure sequential composition (the conservative view).
        composition: how ``per_hour`` composes.
    """

    per_hour: Positive
    epsilon_per_feature_per_chunk: Positive
    mechanism: Name
    chunk_steps: int = Field(ge=1)
    step_s: Positive
    chunks_per_hour: Positive
    delta: float | None = Field(None, gt=0.0, lt=0.01)
    pure_per_hour: Positive | None = None
    composition: str = "pure ε, sequential over features and chunks"


class Profile(_Strict):
    """A release profile (``schema: gazeguard.profile/1``).

    Attributes:
        name: the profile's name (letters, digits, ``_ . -``).
        task: what the consumer wants to know (e.g. ``activity``).
        classes: the task's classes in the build data (the labels a model for it predicts).
        features: the released features, most task-specific first.
        suggested_budget: the cost at the noise level the profile was built for.
        built: how it was built: dataset, criterion, scores, frontier, choice, date, version,
            command line.
        gazeguard_version: version of gazeguard that wrote the file.
    """

    schema_: Literal["gazeguard.profile/1"] = Field(PROFILE_SCHEMA, alias="schema")
    name: Name
    task: Name
    classes: list[Name] = Field(default_factory=list)
    features: list[Name] = Field(min_length=1)
    suggested_budget: SuggestedBudget | None = None
    built: dict[str, Any] = Field(default_factory=dict)
    gazeguard_version: Name = __version__
    _source: str = PrivateAttr(default="<memory>")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            msg = (
                "use letters, digits, '_', '.' or '-' (at most 64), starting with a letter or digit"
            )
            raise ValueError(msg)
        return v

    @field_validator("features", "classes")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return unique_names(v, "listed more than once")

    @property
    def source(self) -> str:
        """Where the profile was loaded from (for messages)."""
        return self._source

    def to_json(self) -> str:
        """The profile file's JSON text."""
        return self.model_dump_json(by_alias=True, indent=1) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the profile file; returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json())
        return p


# ------------------------------------------------------------------------------ loading
def shipped_profiles() -> list[str]:
    """Names of the profiles shipped in ``gazeguard/data/profiles/``."""
    root = resources.files("gazeguard") / "data" / "profiles"
    if not root.is_dir():
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def profile_from_dict(data: Any, source: str = "<memory>") -> Profile:
    """Validate a parsed profile; every feature must be one the registry knows.

    Raises:
        ConfigError: naming the field (e.g. ``features[3]``), the value and the source, with a
            did-you-mean for misspelt feature names.
    """
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, source) from None
    check_feature_names(profile.features, "features", source)
    profile._source = source
    return profile


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a release profile by shipped name (``"activity"``) or path to its JSON file.

    A string containing ``/`` or ending in ``.json`` (or naming an existing file) is a path;
    anything else is a shipped name (:func:`shipped_profiles`).

    Raises:
        ConfigError: no such profile (with a did-you-mean), not JSON (line and column),
            malformed (the field), or an unknown feature name (with a did-you-mean).
    """
    data, source = read_named_json(name_or_path, "profile", shipped_profiles())
    return profile_from_dict(data, source)


# ------------------------------------------------------------------------------ ranking
