"""Running ``gazeguard eval`` in the command-line tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


def synthetic_eval_args(tmp_path: Path, mechanisms: str, *options: str) -> list[str]:
    """``gazeguard eval`` of ``mechanisms`` at ε = 2.4 on 3 synthetic people of 62 s, one
    classification repetition, then ``options``; features cached in ``tmp_path / "cache"``, and
    last ``--out tmp_path / "out"``."""
    return [
        "eval", "--dataset", "synthetic", "--synthetic-people", "3", "--synthetic-duration", "62",
        "--mechanisms", mechanisms, "--epsilons", "2.4", "--clf-reps", "1", *options,
        "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"),
    ]  # fmt: skip


@dataclass(frozen=True)
class EvalRun:
    """A ``gazeguard eval`` that exited 0: its arguments, output folder and what it printed."""

    args: list[str]
    out: Path
    stdout: str
    stderr: str


class SyntheticEval(Protocol):
    """The ``synthetic_eval`` fixture: run :func:`synthetic_eval_args` (``mechanisms``,
    ``*options``), assert exit status 0."""

    def __call__(self, mechanisms: str, *options: str) -> EvalRun:
        """Run the command; its output folder is ``tmp_path / "out"``."""
        ...
