"""Fixtures of the offline tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from gazeguard.cli import main
from tests.offline._eval_cli import EvalRun, SyntheticEval, synthetic_eval_args


@pytest.fixture
def synthetic_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> SyntheticEval:
    """Runs ``gazeguard eval`` on 3 synthetic people in ``tmp_path`` (see
    :func:`tests.offline._eval_cli.synthetic_eval_args`) and asserts it exits 0."""

    def run(mechanisms: str, *options: str) -> EvalRun:
        args = synthetic_eval_args(tmp_path, mechanisms, *options)
        assert main(args) == 0
        text = capsys.readouterr()
        return EvalRun(args, tmp_path / "out", text.out, text.err)

    return run
