"""Every example in the README runs, every configuration block validates, and CI runs the
README's own test command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gazeguard.config import load_settings

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("code", re.findall(r"```python\n(.*?)```", README, re.S))
def test_python_examples_run(code: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("toml", re.findall(r"```toml\n(.*?)```", README, re.S))
def test_toml_examples_validate(toml: str, tmp_path: Path) -> None:
    path = tmp_path / "gazeguard.toml"
    path.write_text(toml)
    load_settings(path)


def test_ci_runs_the_readme_test_command() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    lines = first_block.group(1).strip().splitlines()
    assert len(lines) == 2, "the README opens with two commands: run, and test"
    assert "gazeguard run" in lines[0]
    test_command = lines[1].split("&&")[-1].split("#")[0].strip()
    assert test_command == "python3 -m pytest -q"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_command in [line.strip() for line in ci]
