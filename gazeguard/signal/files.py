"""Files gazeguard ships by name (label models, release profiles): reading one by name or
path, turning a pydantic validation error into a :class:`ConfigError` that names the field, and
refusing unknown feature names with a "did you mean"."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gazeguard.core.errors import ConfigError
from gazeguard.signal.features import NAMES

__all__ = ["check_feature_names", "read_named_json", "validation_error"]


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_feature_names(names: Sequence[str], field_name: str, source: str) -> None:
    """Refuse names the feature registry does not know (with a did-you-mean)."""

    for i, name in enumerate(names):
        if name not in NAMES:
            raise ConfigError(
                f"{field_name}[{i}]",
                name,
                f"unknown feature{_did_you_mean(name, NAMES)} "
                "(known: gazeguard.signal.features.NAMES, "
                "e.g. `python -c 'import gazeguard.signal.features as f; print(f.NAMES)'`)",
                source,
            )


_LEADING_FIELD = re.compile(r"^(?:Value error, )?([A-Za-z_][\w.]*): (.*)$", re.S)


def validation_error(exc: ValidationError, source: str) -> ConfigError:
    """The first problem of a pydantic error as a :class:`ConfigError` naming the field.

    Whole-file checks (shapes, duplicates) report ``"field: reason"``; their field is taken from
    the message, and the value shown is that field's input when it is a scalar.
    """
    errors = exc.errors()
    err = errors[0]
    loc = ".".join(str(x) for x in err["loc"])
    reason = str(err["msg"])
    value = err.get("input")
    if not loc:
        m = _LEADING_FIELD.match(reason)
        if m is not None:
            loc, reason = m.group(1), m.group(2)
            value = value.get(loc.split(".")[0]) if isinstance(value, dict) else value
        else:
            loc = "(file)"
    shown = value if not isinstance(value, dict | list) else f"<{type(value).__name__}>"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return ConfigError(loc, shown, f"{reason}{more}", source)


def read_named_json(name_or_path: str | Path, kind: str, shipped: list[str]) -> tuple[Any, str]:
    """A ``kind`` file (``model``, ``profile``) by shipped name (``gazeguard/data/{kind}s/``) or
    by path: its parsed JSON and a description of where it came from.

    Raises:
        ConfigError: the file is missing, the name is not shipped (with a did-you-mean), or the
            text is not JSON (with its line and column).
    """
    text_name = str(name_or_path)
    path = Path(name_or_path)
    looks_like_path = (
        isinstance(name_or_path, Path) or "/" in text_name or text_name.endswith(".json")
    )
    if looks_like_path or path.is_file():
        if not path.is_file():
            raise ConfigError(kind, text_name, "file not found")
        source = f"{kind} file {path}"
        raw = path.read_text()
    else:
        if text_name not in shipped:
            raise ConfigError(
                kind,
                text_name,
                f"no shipped {kind} of that name{_did_you_mean(text_name, shipped)} "
                f"(shipped: {', '.join(shipped) or 'none'}); or give a path to a .json file",
            )
        res = resources.files("gazeguard") / "data" / f"{kind}s" / f"{text_name}.json"
        source = f"shipped {kind} {text_name!r} ({res})"
        raw = res.read_text()
    try:
        return json.loads(raw), source
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{kind} (line {exc.lineno}, column {exc.colno})",
            text_name,
            f"not JSON: {exc.msg}",
            source,
        ) from None
