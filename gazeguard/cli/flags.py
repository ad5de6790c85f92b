"""The settings flags of ``gazeguard run``, ``demo`` and ``plan``, generated from the schema.

:data:`FLAGS` names the settings that have a flag and the flag's name; everything else comes from
:class:`gazeguard.config.Settings`: the help text (the field's description, then the setting's
name and its default with the unit), the type (``float``, ``int``, a comma-separated list, a
switch for a ``bool``), the choices (a ``Literal``) and the group (the section). A flag only
converts the text it is given: the settings validate it, so a bad value is reported by
:func:`gazeguard.runtime.preflight.check_settings` with its field and a suggestion.

:data:`SHORTCUTS` are the few hand-written flags that are not one setting: ``--labels [MODEL]``
and ``--cohort NAME`` switch a section on and set one of its settings, ``--ledger`` sets the
ledger's path or URL, ``--broker HOST[:PORT]`` the broker's host and port.
:func:`settings_overrides` turns both kinds back into nested settings, so a new setting with a
flag is one line of :data:`FLAGS`.
"""

from __future__ import annotations

import argparse
import inspect
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gazeguard.config import Epsilon, LabelSettings, Settings, broker_address
from gazeguard.ledger import is_url
from gazeguard.privacy.mechanisms.registry import ONLINE_MECHANISMS

#: The words ``--budget-per-hour`` (any number setting whose default is set) takes for "unset".
NONE_WORDS = ("none", "null", "off")

#: Title of the group of the top-level settings and ``--config``.
TOP_GROUP = "configuration (flags override GAZEGUARD_* env and --config)"


@dataclass(frozen=True)
class Flag:
    """A flag that sets one setting.

    Attributes:
        setting: the setting's dotted name (``"ingest.rate_hz"``; ``"device"`` at the top).
        names: the option strings (``("-k", "--k")``); the destination is the first long one's.
        metavar: the value's name in ``--help`` (default: from the unit or the type).
        choices: the accepted values of a ``str`` setting a validator checks (its annotation
            lists none); a ``Literal``'s come from the annotation.
        refused: values accepted here although the setting refuses them, so that its validator
            says why (a retired choice).
    """

    setting: str
    names: tuple[str, ...]
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shortcut:
    """A hand-written flag that is not one setting.

    Attributes:
        section: the section whose group lists it (``None``: the top group).
        name: the option string.
        apply: the nested settings (``{section: {name: value}}``) a given value sets.
        help: its help text.
        options: more of ``add_argument``'s keywords (``metavar``, ``type``, ``nargs``, …).
    """

    section: str | None
    name: str
    apply: Callable[[Any], dict[str, dict[str, Any]]]
    help: str
    options: Mapping[str, Any] = field(default_factory=dict)


FLAGS: tuple[Flag, ...] = (
    Flag("device", ("--device",)),
    Flag("session", ("--session",)),
    Flag("ingest.source", ("--source",)),
    Flag("ingest.stream_type", ("--stream-type",), metavar="TYPE"),
    Flag("ingest.stream_name", ("--stream-name",), metavar="NAME"),
    Flag("ingest.source_id", ("--source-id",), metavar="ID"),
    Flag("ingest.stream_host", ("--stream-host",), metavar="HOST"),
    Flag("ingest.rate_hz", ("--stream-rate",)),
    Flag("features.window_s", ("--window-s",)),
    Flag("features.step_s", ("--step-s",)),
    Flag("mechanism.name", ("--mechanism",), choices=(*ONLINE_MECHANISMS, "auto")),
    Flag("mechanism.transform", ("--transform",)),
    Flag("mechanism.chunk_steps", ("--chunk-steps",), metavar="N"),
    Flag("mechanism.k", ("-k", "--k"), metavar="K|auto"),
    Flag("mechanism.epsilon", ("--epsilon",)),
    Flag("mechanism.features", ("--features",), metavar="NAMES"),
    Flag("mechanism.profile", ("--profile",), metavar="NAME|PATH"),
    Flag("ledger.budget_per_hour", ("--budget-per-hour",)),
    Flag("ledger.session_cap", ("--session-cap",)),
    Flag("fleet.enabled", ("--fleet",)),
    Flag("labels.release", ("--label-release",), refused=("change",)),
    Flag("labels.decision_s", ("--decision-s",)),
    Flag("labels.epsilon", ("--label-epsilon",)),
    Flag("labels.budget_share", ("--label-share",)),
    Flag("cohort.bucket_s", ("--bucket-s",)),
    Flag("cohort.budget_share", ("--cohort-share",)),
    Flag("cohort.model", ("--cohort-model",), metavar="MODEL"),
    Flag("cohort.release", ("--cohort-release",), metavar="LIST"),
    Flag("cohort.attention_aois", ("--attention-aois",), metavar="FILE"),
    Flag("metrics.port", ("--metrics-port",), metavar="PORT"),
)


def _ledger(where: str) -> dict[str, dict[str, Any]]:
    """``--ledger``: a URL is ledger.url (as a path, ``//`` would collapse to ``/``); a path
    clears a configured URL."""
    return {"ledger": {"url": where} if is_url(where) else {"path": where, "url": None}}


SHORTCUTS: tuple[Shortcut, ...] = (
    Shortcut(
        "labels",
        "--labels",
        lambda model: {"labels": {"enabled": True, "model": model}},
        "publish private labels from this label model (a shipped name or a .json path; default "
        "%(const)s: 4 activities, trained for a change of headset) on "
        "{prefix}/{device}/{session}/labels [labels.enabled, labels.model]",
        {"nargs": "?", "const": LabelSettings().model, "metavar": "MODEL"},
    ),
    Shortcut(
        "cohort",
        "--cohort",
        lambda name: {"cohort": {"enabled": True, "name": name}} if name else {},
        "publish DP aggregates over this worker's sessions on {prefix}/cohort/NAME/… (needs "
        "--fleet and a --budget-per-hour) [cohort.enabled, cohort.name]",
        {"metavar": "NAME"},
    ),
    Shortcut(
        "ledger",
        "--ledger",
        _ledger,
        "the ledger: an SQLite file, or a postgresql:// URL for fleets (default "
        "gazeguard-ledger.sqlite) [ledger.path or ledger.url]",
        {"metavar": "PATH|URL"},
    ),
    Shortcut(
        "broker",
        "--broker",
        lambda address: {"broker": broker_address(address)} if address else {},
        "the MQTT broker (default: start an embedded one) [broker.host, broker.port]",
        {"metavar": "HOST[:PORT]"},
    ),
)


def _section(name: str) -> type[BaseModel] | None:
    """The model of a section of :class:`Settings` (``None``: ``name`` is a plain setting)."""
    annotation = Settings.model_fields[name].annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _field(path: str) -> FieldInfo:
    """The schema's field of a dotted setting name (``"section.name"`` or ``"name"``).

    Raises:
        KeyError: no such setting.
    """
    section, _, name = path.rpartition(".")
    model = _section(section) if section else Settings
    if model is None:
        raise KeyError(path)
    return model.model_fields[name]


def _parts(annotation: Any) -> tuple[Any, bool]:
    """A field's annotation without ``Annotated`` and ``None``: ``(type, nullable)``; a union of
    several types stays a union."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        kept = tuple(a for a in get_args(annotation) if a is not type(None))
        nullable = len(kept) < len(get_args(annotation))
        if len(kept) == 1:
            return _parts(kept[0])[0], nullable
        return annotation, nullable
    return annotation, False


def _literal(annotation: Any) -> tuple[str, ...] | None:
    """A ``Literal``'s values as text, ``None`` for any other type."""
    if get_origin(annotation) is Literal:
        return tuple(str(v) for v in get_args(annotation))
    return None


def _is_epsilon(info: FieldInfo) -> bool:
    """Whether a field is an :data:`~gazeguard.config.Epsilon` (``float`` with its check),
    also when it may be unset (``Epsilon | None``)."""
    check = get_args(Epsilon)[1:]
    return Epsilon in get_args(info.annotation) or any(m in info.metadata for m in check)


def _unit(name: str) -> str:
    """The unit a setting's name ends with (``_s``: seconds, ``_hz``: hertz), or ``""``."""
    return {"s": " s", "hz": " Hz"}.get(name.rpartition("_")[2], "")


def _default(info: FieldInfo, name: str) -> str | None:
    """The default for ``--help`` (``None`` when unset, a switch off, or computed)."""
    value = info.default
    if value is PydanticUndefined or value is None or value is False:
        return None
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}{_unit(name)}"
    return f"{value}{_unit(name)}"


def _none_or(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert``, or :data:`NULL` for one of :data:`NONE_WORDS`."""

    def parse(text: str) -> Any:
        if text.strip().lower() in NONE_WORDS:
            return NULL
        try:
            return convert(text)
        except ValueError:
            msg = f"expected a number or 'none', got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None

    return parse


#: A flag's value that sets its setting to ``None`` (``--budget-per-hour none``).
NULL: Final = object()


def _comma_list(text: str) -> list[str]:
    """``"a, b,,c"`` → ``["a", "b", "c"]``."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _argument(flag: Flag) -> dict[str, Any]:
    """``add_argument``'s keywords for a flag, from its setting's field.

    Raises:
        TypeError: the setting's type has no flag form (a table, a pair, a section).
    """
    info = _field(flag.setting)
    name = flag.setting.rpartition(".")[2]
    kind, nullable = _parts(info.annotation)
    suffix: list[str] = []
    default = _default(info, name)
    options: dict[str, Any] = {"dest": _dest(flag)}
    metavar = flag.metavar
    choices = flag.choices or _literal(kind)
    if kind is bool:
        options["action"] = "store_true"
        options["default"] = None
        default = None
    elif choices is not None:
        options["choices"] = [*choices, *flag.refused]
        metavar = metavar or "{" + ",".join(choices) + "}"
    elif kind in (float, int):
        unit = _unit(name).strip().upper()
        metavar = metavar or ("EPS" if _is_epsilon(info) else {"S": "SECONDS"}.get(unit, unit))
        options["type"] = kind
        if nullable and default is not None:  # unset by a word: --budget-per-hour none
            options["type"] = _none_or(kind)
            metavar = f"{metavar or name.upper()}|none"
            suffix.append("'none': unset")
    elif get_origin(kind) is list:
        options["type"] = _comma_list
        item = _literal(get_args(kind)[0])
        suffix.append("comma-separated" + (f": {', '.join(item)}" if item else ""))
    elif kind in (str, Path) or (get_origin(kind) in (Union, types.UnionType)):
        pass  # the text as given; the settings convert and check it
    else:
        msg = f"setting {flag.setting} ({kind}) has no flag form"
        raise TypeError(msg)
    if metavar:
        options["metavar"] = metavar
    if default is not None:
        suffix.append(f"default {default}")
    described = (info.description or "").rstrip(".")
    help_ = f"{described} [{'; '.join([flag.setting, *suffix])}]"
    options["help"] = help_.replace("%", "%%")  # argparse %-formats help
    return options


def _dest(flag: Flag) -> str:
    """The namespace attribute of a flag, as argparse would name it."""
    long = next((n for n in flag.names if n.startswith("--")), flag.names[0])
    return long.lstrip("-").replace("-", "_")


def _summary(model: type[BaseModel]) -> str:
    """A section's title: its docstring up to the first ``.``, ``:`` or ``;``, plain text."""
    doc = " ".join(inspect.cleandoc(model.__doc__ or "").split())
    doc = re.sub(r":\w+:`~?([^`]+)`|``([^`]+)``", lambda m: m[1] or m[2], doc)
    return re.split(r"[.:;](?:\s|$)", doc, maxsplit=1)[0]


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` and the settings flags (:data:`FLAGS`, :data:`SHORTCUTS`): one group per
    section that has a flag, in the schema's order; a flag given wins over ``GAZEGUARD_*`` and
    the file."""
    top = parser.add_argument_group(TOP_GROUP)
    top.add_argument("--config", type=Path, help="TOML configuration file")
    flags = {f.setting: f for f in FLAGS}
    for section in [None, *Settings.model_fields]:
        model = Settings if section is None else _section(section)
        if model is None:
            continue  # a top-level setting: in the top group
        prefix = f"{section}." if section else ""
        settings = [prefix + n for n in model.model_fields if prefix + n in flags]
        shortcuts = [s for s in SHORTCUTS if s.section == section]
        if not (shortcuts or settings):
            continue
        group = (
            top if section is None else parser.add_argument_group(f"[{section}] {_summary(model)}")
        )
        for shortcut in shortcuts:
            group.add_argument(shortcut.name, help=shortcut.help, **shortcut.options)
        for setting in settings:
            group.add_argument(*flags[setting].names, **_argument(flags[setting]))


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags given on the command line set, nested by section (a flag not
    given sets nothing; :data:`NULL` sets ``None``)."""
    out: dict[str, Any] = {}
    for shortcut in SHORTCUTS:
        value = getattr(args, shortcut.name.lstrip("-").replace("-", "_"), None)
        for section, values in ({} if value is None else shortcut.apply(value)).items():
            out.setdefault(section, {}).update(values)
    for flag in FLAGS:
        value = getattr(args, _dest(flag), None)
        if value is not None and value != []:
            section, _, key = flag.setting.rpartition(".")
            (out.setdefault(section, {}) if section else out)[key] = (
                None if value is NULL else value
            )
    return out
