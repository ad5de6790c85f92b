"""Arguments of the ``gazeguard eval`` command-line tests."""

from __future__ import annotations

from pathlib import Path


def synthetic_eval_args(tmp_path: Path, mechanisms: str, *options: str) -> list[str]:
    """``gazeguard eval`` of ``mechanisms`` at ε = 2.4 on 3 synthetic people of 62 s, one
    classification repetition, then ``options``; features cached in ``tmp_path / "cache"``, and
    last ``--out tmp_path / "out"``."""
    return [
        "eval", "--dataset", "synthetic", "--synthetic-people", "3", "--synthetic-duration", "62",
        "--mechanisms", mechanisms, "--epsilons", "2.4", "--clf-reps", "1", *options,
        "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"),
    ]  # fmt: skip
