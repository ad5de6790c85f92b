"""The worker's seams (issue "A layered house"): the ingest adapters reach a fleet only through
its public :class:`~gazeguard.runtime.fleet.SessionHost`, no module imports another module's
private name, and the compiled passes are chosen once, where the worker starts, and reach every
session's detector and extractor."""

from __future__ import annotations

import ast
import contextlib
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import gazeguard
from gazeguard.config import Settings
from gazeguard.plan import ReleasePlan
from gazeguard.runtime.fleet import OUTLIVED_AFTER_S, Fleet, LongLived
from gazeguard.runtime.service import open_ledger
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.compiled import load_kernels

PACKAGE = Path(gazeguard.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_a_private_name_of_another() -> None:
    """No ``from m import _name``; a private module (``_x``) is imported only from within the
    package that holds it."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _module_of(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found += [
                    f"{here}: from {node.module} import {a.name}"
                    for a in node.names
                    if _private(a.name)
                ]
                parts = node.module.split(".")
                for i, part in enumerate(parts):
                    owner = ".".join(parts[:i])
                    if _private(part) and not (here + ".").startswith(owner + "."):
                        found.append(f"{here}: from {node.module} (private to {owner})")
    assert found == []


class _Publisher:
    """What :class:`Fleet` asks of its publisher when it opens and closes sessions."""

    settings = SimpleNamespace(topic_prefix="gazeguard/v1")

    def __init__(self) -> None:
        self.statuses: list[Any] = []

    def publish_status(self, status: Any) -> None:
        self.statuses.append(status)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_workers_kernels_reach_every_sessions_detector_and_extractor(
    tmp_path: Path, compiled: bool
) -> None:
    if compiled:
        pytest.importorskip("numba")
    settings = Settings.model_validate(
        {"ledger": {"path": str(tmp_path / "l.sqlite")}, "fleet": {"compiled": compiled}}
    )
    plan = ReleasePlan.from_settings(settings)
    kernels = load_kernels(settings.fleet.compiled)
    assert (kernels is not None) is compiled
    with open_ledger(settings.ledger, plan) as ledger:
        fleet = Fleet(settings, plan, ledger, _Publisher(), kernels)  # type: ignore[arg-type]
        entry = fleet.open_session("s1", 120.0, device="hmd-1")
        assert entry is not None
        assert fleet.open_session("s1", 120.0) is entry
        fx = entry.pipeline.extractor
        assert fx.kernels is kernels
        assert fx.detector.kernels is kernels
        fleet.close_session("s1")
        fleet.close_session("s1")  # nothing: not open
        assert fleet.closed == ["s1"]
        assert fleet.sessions == {}


@contextlib.contextmanager
def _default_fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A worker at the default settings, its ledger in ``tmp_path``, numpy passes, publishing
    to :class:`_Publisher`."""
    settings = Settings.model_validate({"ledger": {"path": str(tmp_path / "l.sqlite")}})
    plan = ReleasePlan.from_settings(settings)
    with open_ledger(settings.ledger, plan) as ledger:
        yield Fleet(settings, plan, ledger, _Publisher(), None)  # type: ignore[arg-type]


def test_closed_sessions_are_freed_without_the_collector(tmp_path: Path) -> None:
    """A closed session's pipeline (having released chunks) is freed by reference counting
    alone, with the collector off, so the worker's ``LongLived`` need not thaw what it froze
    when sessions close: 40 closes (two checks' worth) leave the frozen objects frozen. A thaw
    made the next full collection walk every open session (> 100 ms at 900 sessions)."""
    gaze = simulate_gaze(80.0, 120.0, seed=3)
    with _default_fleet(tmp_path) as fleet:
        gc.collect()
        gc.disable()
        try:
            refs = []
            for i in range(40):
                entry = fleet.open_session(f"s{i}", 120.0)
                assert entry is not None
                if i < 4:
                    assert entry.pipeline.push(gaze)  # a session that released chunks
                refs.append(weakref.ref(entry.pipeline))
            del entry
            frozen = gc.get_freeze_count()
            assert frozen > 0
            for i in range(40):
                fleet.close_session(f"s{i}")
            assert [r() is None for r in refs] == [True] * 40
            # nothing thawed (a thaw empties the permanent generation; the closed pipelines'
            # frozen objects left it as they were freed)
            assert 0 < gc.get_freeze_count() < frozen
        finally:
            gc.enable()
            gc.unfreeze()


def test_a_sweep_holding_the_sessions_it_closes_thaws_nothing(tmp_path: Path) -> None:
    """The worker's idle sweep closes sessions while its list still holds them all: none has
    outlived its close (it is let go when the sweep ends), so nothing is thawed. Judged at
    once, the 17th close thawed and the next full collection walked every open session
    (124 ms at 900 sessions, bench_fleet at 6858edb, as the sessions closed)."""
    with _default_fleet(tmp_path) as fleet:
        try:
            for i in range(40):
                assert fleet.open_session(f"s{i}", 120.0) is not None
            for session, _entry in list(fleet.sessions.items()):  # as the idle sweep
                fleet.close_session(session)
            assert fleet.sessions == {}
            assert gc.get_freeze_count() > 0  # not thawed
        finally:
            gc.unfreeze()


class _Pipe:
    """Stands for a closed session's pipeline: only its lifetime matters."""


def test_a_closed_pipeline_that_outlives_its_close_is_thawed_for_the_collector() -> None:
    """A pipeline still alive :data:`OUTLIVED_AFTER_S` after its close (as one held by a
    reference cycle would be) makes ``LongLived`` thaw at the next check, so that a full
    collection can take that garbage; pipelines freed at their close never do."""
    now = [0.0]
    for keep in (False, True):
        heap = LongLived(clock=lambda: now[0])
        kept = _Pipe()
        try:
            heap.opened()
            heap.closed(kept if keep else _Pipe(), 20)
            for _ in range(16):
                heap.closed(_Pipe(), 20)  # freed at once
            assert gc.get_freeze_count() > 0  # not judged yet: closed just now
            now[0] += OUTLIVED_AFTER_S
            heap.closed(_Pipe(), 20)  # the first close is judged
            assert (gc.get_freeze_count() == 0) is keep, keep
        finally:
            gc.unfreeze()
