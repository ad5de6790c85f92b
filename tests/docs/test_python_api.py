"""docs/python-api.md: its code runs as written, against a real ledger, and imports only from
the package's top level; ``import gazeguard`` alone loads none of the layers (its version
only)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gazeguard

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def _snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_docs_code_imports_only_the_public_names() -> None:
    (code,) = _snippets()
    imports = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert imports
    for node in imports:
        assert isinstance(node, ast.ImportFrom)
        assert node.module == "gazeguard"
        assert {a.name for a in node.names} <= set(gazeguard.__all__)


def test_the_docs_code_runs_and_charges_its_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (code,) = _snippets()
    exec(compile(code, str(DOC), "exec"), {"__name__": "python_api_doc"})
    lines = capsys.readouterr().out.splitlines()
    assert lines
    assert all(re.match(r"chunk \d+: \[.*\] user-level ε \S+ at δ 1e-06 ", ln) for ln in lines)
    ledger = gazeguard.Ledger(str(tmp_path / "vendor-ledger.sqlite"))
    try:
        assert ledger.pending() == []  # every chunk was delivered and acknowledged
    finally:
        ledger.close()


def test_import_gazeguard_loads_no_layer() -> None:
    code = (
        "import sys, gazeguard; print(sorted(m for m in sys.modules if m.startswith('gazeguard.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['gazeguard.core', 'gazeguard.core.version']"


def test_every_public_name_resolves() -> None:
    for name in gazeguard.__all__:
        assert getattr(gazeguard, name) is not None
    with pytest.raises(AttributeError):
        _ = gazeguard.not_a_name  # type: ignore[attr-defined]
