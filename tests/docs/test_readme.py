"""Every example in the README and the docs runs, every configuration block validates, every
example message validates, every consumer reads a live run, every relative link resolves, and
CI runs the README's own test command.

The docs are ``README.md`` and ``docs/*.md`` except ``docs/design.md`` (the design's prose, not
a guide: it carries no runnable examples)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import jsonschema
import pytest

from gazeguard.config import load_settings
from gazeguard.wire.kinds import KINDS
from gazeguard.wire.message import shipped_schema
from tests.conftest import MosquittoBroker

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DOCS = [
    REPO / "README.md",
    *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "design.md"),
]


def blocks(lang: str) -> list[tuple[str, str]]:
    """``(file:line, code)`` of every fenced ``lang`` block of the docs."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(rf"```{lang}\n(.*?)```", text, re.S):
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{doc.relative_to(REPO)}:{line}", m.group(1)))
    return found


def subscribes(code: str) -> bool:
    """A consumer example: it subscribes to a broker and runs until stopped."""
    return "aiomqtt.Client(" in code or "mqtt.Client(" in code


PYTHON = blocks("python")
EXAMPLES = [(where, code) for where, code in PYTHON if not subscribes(code)]
CONSUMERS = [(where, code) for where, code in PYTHON if subscribes(code)]


@pytest.mark.slow
@pytest.mark.parametrize("code", [c for _, c in EXAMPLES], ids=[w for w, _ in EXAMPLES])
def test_python_examples_run(code: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


TOML = blocks("toml")


@pytest.mark.parametrize("toml", [c for _, c in TOML], ids=[w for w, _ in TOML])
def test_toml_examples_validate(toml: str, tmp_path: Path) -> None:
    path = tmp_path / "gazeguard.toml"
    path.write_text(toml)
    load_settings(path)


# Example messages (docs/consumer.md): what a consumer is told a field is called is what the
# models and the shipped schemas call it.
MODELS = {k.contract.schema: (k.model, k.contract.schema_file) for k in KINDS}
MESSAGES = [(w, c) for w, c in blocks("json") if re.search(r'"schema": "gazeguard\.', c)]


def test_the_consumer_guide_shows_every_kind_of_message() -> None:
    kinds = {json.loads(c)["schema"] for _, c in MESSAGES}
    wanted = {"gazeguard.chunk/2", "gazeguard.label/1", "gazeguard.mode/1", "gazeguard.cohort/1"}
    assert wanted <= kinds, kinds


@pytest.mark.parametrize("example", [c for _, c in MESSAGES], ids=[w for w, _ in MESSAGES])
def test_example_messages_validate(example: str) -> None:
    data = json.loads(example)
    model, schema_file = MODELS[data["schema"]]
    model.model_validate_json(example)  # the model's own checks (shapes, ε consistency)
    jsonschema.validate(data, shipped_schema(schema_file))


OPEN: list[IO[str]] = []


def _start(args: list[str], cwd: Path, env: dict[str, str], name: str) -> subprocess.Popen[str]:
    """``args`` in ``cwd``, stdout and stderr into ``name.out`` and ``name.err``."""
    out = (cwd / f"{name}.out").open("w")
    err = (cwd / f"{name}.err").open("w")
    OPEN.extend((out, err))
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=err, text=True)


def _read(cwd: Path, name: str) -> str:
    return (cwd / name).read_text() if (cwd / name).exists() else ""


@pytest.mark.slow
@pytest.mark.network
def test_consumer_examples_read_a_live_run(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """Each consumer example, run as written against a real Mosquitto, prints the chunks,
    labels and cohort aggregates it handles, from a live `gazeguard run --labels` and a live
    `gazeguard run --fleet --cohort`: the field names it reads are the ones published."""
    assert CONSUMERS, "the README shows a consumer"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "GAZEGUARD_BROKER__HOST": mosquitto.host,
        "GAZEGUARD_BROKER__PORT": str(mosquitto.port),
    }
    gg = [sys.executable, "-m", "gazeguard"]
    fast = ["--profile", "activity", "--chunk-steps", "8", "--duration", "150"]
    procs = {
        "solo": _start([*gg, "run", "--source", "simulated", "--source-id", f"{unique_id}-solo",
                        "--labels", "--label-release", "clock", "--decision-s", "5",
                        "--ledger", "solo.sqlite", *fast], tmp_path, env, "solo"),
        "headset": _start([*gg, "simulate", "--name", unique_id, "--source-id",
                           f"{unique_id}-sim", "--duration", "180"], tmp_path, env, "headset"),
        "fleet": _start([*gg, "run", "--fleet", "--source", "lsl", "--stream-name", unique_id,
                         "--cohort", "lab", "--cohort-model", "activity", "--bucket-s", "10",
                         "--cohort-release", "mode,means,shares",
                         "--ledger", "fleet.sqlite", *fast], tmp_path, env, "fleet"),
    }  # fmt: skip
    wanted = {}
    for i, (where, code) in enumerate(CONSUMERS):
        (tmp_path / f"consumer{i}.py").write_text(code)
        procs[f"consumer{i}"] = _start(
            [sys.executable, f"consumer{i}.py"], tmp_path, env, f"consumer{i}"
        )
        handles = {k for k in ("chunk", "label", "mode", "cohort") if f'"gazeguard.{k}/' in code}
        assert handles, where
        wanted[f"consumer{i}"] = (where, handles)

    def printed(name: str) -> set[str]:
        return {line.split(" ", 1)[0] for line in _read(tmp_path, f"{name}.out").splitlines()}

    try:
        deadline = time.monotonic() + 170
        while time.monotonic() < deadline:
            if all(kinds <= printed(n) for n, (_, kinds) in wanted.items()):
                break
            if any(procs[n].poll() is not None for n in wanted):
                break
            time.sleep(1)
    finally:
        for name, p in procs.items():  # the consumers as a person stops them: Ctrl-C
            if p.poll() is None:
                p.send_signal(signal.SIGINT if name in wanted else signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        while OPEN:
            OPEN.pop().close()
    logs = "\n".join(f"--- {n}.err\n{_read(tmp_path, f'{n}.err')[-3000:]}" for n in procs)
    for name, (where, kinds) in wanted.items():
        out, err = _read(tmp_path, f"{name}.out"), _read(tmp_path, f"{name}.err")
        assert "Traceback" not in err, f"{where}\n{err}"
        assert kinds <= printed(name), f"{where} printed {printed(name)}\n{out[-2000:]}\n{logs}"
        assert procs[name].returncode == 0, f"{where}: Ctrl-C\n{err}"


@pytest.mark.network
@pytest.mark.parametrize("code", [c for _, c in CONSUMERS], ids=[w for w, _ in CONSUMERS])
def test_a_consumer_example_stops_on_ctrl_c_without_a_traceback(
    code: str, tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """Each consumer example, connected to a broker, exits 0 and prints no traceback on Ctrl-C
    (it printed a KeyboardInterrupt traceback)."""
    env = {
        **os.environ,
        "GAZEGUARD_BROKER__HOST": mosquitto.host,
        "GAZEGUARD_BROKER__PORT": str(mosquitto.port),
    }
    (tmp_path / "consumer.py").write_text(code)
    proc = subprocess.Popen(
        [sys.executable, "consumer.py"], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 30  # until it subscribed (the broker's log says so)
    while time.monotonic() < deadline and "Received SUBSCRIBE" not in _read(
        mosquitto.workdir, mosquitto.log.name
    ):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert "KeyboardInterrupt" not in err, err


def test_the_readme_starts_with_its_two_commands_and_the_fast_loop() -> None:
    assert README.index("```") == README.index("```bash\n"), "the first block is the commands"
    first_section = README.split("\n## ", 1)[0]
    assert 'python3 -m pytest -q -m "not slow"' in first_section


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


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces → '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_resolve() -> None:
    """Every relative link of the README and the docs names a file that exists and, for a
    Markdown file, a heading it has."""
    broken = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken
