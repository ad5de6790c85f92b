"""Reading a configuration and reporting every problem in it: each with the field, the value, the
reason, where the value came from (a file, an environment variable, a command-line argument or
the defaults) and a "did you mean" where one fits.

:func:`load_settings` refuses the first invalid value; :func:`check_with` collects every
problem — the schema's and those of a validator (:func:`gazeguard.runtime.preflight.
validate_settings`), which checks what only shows when ``gazeguard run`` builds its stages — and,
when the schema refused something, runs the validator again over the rest (unknown keys ignored,
refused values at their defaults) so that one typo does not hide the other problems.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import SettingsConfigDict

from gazeguard.config.settings import Section, Settings
from gazeguard.core.errors import ConfigError

Loc = tuple[str | int, ...]


def _in_file(loc: Loc, doc: dict[str, Any] | None) -> bool:
    node: Any = doc
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if not (in_dict or in_list):
            return False
        node = node[part]
    return doc is not None


def _source_of(loc: Loc, overrides: dict[str, Any], path: Path | None) -> str:
    """Where the value at ``loc`` came from: flag, environment variable, file or defaults."""
    if _in_file(loc, overrides):
        return "command-line argument"
    names = [str(p) for p in loc if not isinstance(p, int)]
    for n in range(len(names), 0, -1):  # GAZEGUARD_MECHANISM__EPSILON, or a whole section
        env = "GAZEGUARD_" + "__".join(names[:n]).upper()
        if env in os.environ:
            return f"environment variable {env}"
    if path is not None:
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return f"file {path}"
        if _in_file(loc, doc):
            return f"file {path}"
    return "defaults"


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One invalid setting.

    Attributes:
        field: dotted name, e.g. ``"mechanism.features"``.
        value: the rejected value (passwords are masked).
        reason: what is wrong and what to do.
        source: where the value came from (``"file gazeguard.toml"``, ``"environment variable
            GAZEGUARD_…"``, ``"command-line argument"``, ``"defaults"``), when known.
        suggestion: the closest valid name or value ("did you mean"), when one is close.
    """

    field: str
    value: object
    reason: str
    source: str | None = None
    suggestion: str | None = None

    def error(self) -> ConfigError:
        """The problem as the :class:`ConfigError` that refuses it."""
        hint = f"; did you mean {self.suggestion!r}?" if self.suggestion else ""
        return ConfigError(self.field, self.value, self.reason + hint, self.source)

    def __str__(self) -> str:
        return str(self.error())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: field, value, reason, source, suggestion and the full message."""
        value = self.value
        if not isinstance(value, str | int | float | bool | type(None) | list | dict):
            value = str(value)
        return {
            "field": self.field,
            "value": value,
            "reason": self.reason,
            "source": self.source,
            "suggestion": self.suggestion,
            "message": str(self),
        }


def closest(word: object, choices: Any) -> str | None:
    """The choice closest to ``word`` (difflib, cutoff 0.6), for a "did you mean"; ``None``
    when none is close or ``word`` is not a string."""
    if not isinstance(word, str):
        return None
    found = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return found[0] if found else None


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The settings model (section) that holds the field at ``loc``."""
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        sub = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if sub is None:
            return None
        model = sub
    return model


def _suggestion(err: ErrorDetails) -> str | None:
    """A "did you mean" for a misspelt key or choice."""
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden" and loc:
        model = _model_at(loc)
        return None if model is None else closest(loc[-1], model.model_fields)
    expected = (err.get("ctx") or {}).get("expected")
    if isinstance(expected, str):
        return closest(err.get("input"), re.findall(r"'([^']*)'", expected))
    if "must be one of" in err["msg"]:  # a validator naming its choices (the registry's)
        return closest(err.get("input"), re.findall(r"'([^']*)'", err["msg"]))
    return None


def _mask(loc: Loc, value: object) -> object:
    return "**********" if loc and loc[-1] == "password" and value is not None else value


def _read(
    path: Path | None, overrides: dict[str, Any], model: type[Settings] | None = None
) -> tuple[Settings | None, list[ConfigProblem], list[ErrorDetails]]:
    """Settings from ``path``, the environment and ``overrides``, or every schema problem (and
    pydantic's errors)."""
    if path is not None and not path.is_file():
        return None, [ConfigProblem("config", str(path), "file not found")], []
    try:
        return _construct(model or Settings, path, overrides), [], []
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            problems.append(
                ConfigProblem(
                    ".".join(str(p) for p in loc),
                    _mask(loc, err.get("input")),
                    err["msg"],
                    _source_of(loc, overrides, path),
                    _suggestion(err),
                )
            )
        return None, problems, exc.errors()
    except ValueError as exc:  # TOML syntax errors
        return None, [ConfigProblem("config", str(path), str(exc), f"file {path}")], []


def _construct(model: type[Settings], path: Path | None, overrides: dict[str, Any]) -> Settings:
    """``model`` from ``overrides``, the environment and the TOML file ``path`` (``None``: no
    file), validated (ValidationError; ValueError for a file that is not TOML).

    pydantic-settings reads the TOML file its model's configuration names (``toml_file``), so a
    file is read through a subclass of ``model`` that names it, made for this call (no module
    state carries the path). What that subclass validated is returned as a ``model``, without
    validating it again, so that settings read from a file compare, print and pickle as any
    other.
    """
    if path is None:
        return model(**overrides)
    config = SettingsConfigDict(**{**model.model_config, "toml_file": path})
    reader = cast("type[Settings]", type(model.__name__, (model,), {"model_config": config}))
    read = reader(**overrides)
    values = {name: getattr(read, name) for name in model.model_fields}
    return model.model_construct(read.model_fields_set, **values)


@functools.cache
def _lenient() -> type[Settings]:
    """:class:`Settings` that ignores unknown keys (each section too): the second pass of
    :func:`check_with` after the schema refused something."""
    namespace: dict[str, Any] = {
        "model_config": SettingsConfigDict(**{**Settings.model_config, "extra": "ignore"}),
        "__annotations__": {},
    }
    for name, info in Settings.model_fields.items():
        section = info.annotation
        if isinstance(section, type) and issubclass(section, Section):
            config = ConfigDict(extra="ignore", frozen=True)
            lenient = type(f"_Lenient{section.__name__}", (section,), {"model_config": config})
            namespace["__annotations__"][name] = lenient
            namespace[name] = lenient()
    return type("_LenientSettings", (Settings,), namespace)


def _field_default(loc: Loc) -> object:
    model = _model_at(loc)
    if model is None or str(loc[-1]) not in model.model_fields:
        return {}
    return model.model_fields[str(loc[-1])].get_default(call_default_factory=True)


def _patched(overrides: dict[str, Any], locs: list[Loc]) -> dict[str, Any]:
    """``overrides`` with each field at ``locs`` set to its default (overrides win over the
    environment and the file)."""
    out = copy.deepcopy(overrides)
    for loc in locs:
        node = out
        for part in loc[:-1]:
            child = node.get(str(part))
            if not isinstance(child, dict):
                child = node[str(part)] = {}
            node = child
        node[str(loc[-1])] = _field_default(loc)
    return out


def load_settings(path: Path | str | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (TOML), the environment and ``overrides``.

    Checks the schema only (types, ranges, choices);
    :func:`gazeguard.runtime.preflight.check_settings` also runs the checks the schema cannot
    make and reports every problem.

    Raises:
        ConfigError: naming the first invalid field, its value and its source.
    """
    settings, problems, _ = _read(Path(path) if path is not None else None, overrides)
    if settings is None:
        raise problems[0].error()
    return settings


#: A check of loaded settings beyond the schema (:func:`gazeguard.runtime.preflight.
#: validate_settings`): the problems, without their source.
Validator = Callable[[Settings], list[ConfigProblem]]


def check_with(
    validate: Validator, path: Path | str | None = None, **overrides: Any
) -> tuple[Settings | None, list[ConfigProblem]]:
    """Every problem of a configuration, each with its source: the schema's and ``validate``'s.

    The schema lives here; what only shows when the stages are built (the release plan, the
    broker's TLS files, the ledger's stored caps) is ``validate``'s, which the runtime passes
    (:func:`gazeguard.runtime.preflight.check_settings`), so configuration never imports what
    it configures.

    Returns:
        ``(settings, problems)``: ``settings`` is ``None`` when the schema refused a value; then
        ``problems`` lists every schema error and what ``validate`` finds in the rest (unknown
        keys ignored, refused values at their defaults). Otherwise ``problems`` are those of
        ``validate``, empty when the configuration is good. Nothing is written.
    """
    toml = Path(path) if path is not None else None
    settings, problems, errors = _read(toml, overrides)
    if settings is not None:
        found = validate(settings)
        return settings, [
            replace(p, source=_source_of(tuple(p.field.split(".")), overrides, toml)) for p in found
        ]
    # Second pass, so that one typo does not hide the other problems: unknown keys ignored,
    # refused values replaced by their defaults; report what validate finds elsewhere.
    locs = [_field_loc(tuple(e["loc"])) for e in errors if e["type"] != "extra_forbidden"]
    if not errors or any(not loc for loc in locs):
        return None, problems
    partial, _, _ = _read(toml, _patched(overrides, locs), _lenient())
    if partial is None:
        return None, problems
    refused = {".".join(str(p) for p in loc) for loc in locs}
    for p in validate(partial):
        if not any(p.field == f or p.field.startswith(f + ".") for f in refused):
            problems.append(
                replace(p, source=_source_of(tuple(p.field.split(".")), overrides, toml))
            )
    return None, problems


def _field_loc(loc: Loc) -> Loc:
    """The settings field of an error location (list and dict items belong to their field)."""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            return loc[:i]
    return loc
