"""``gazeguard run``: the sidecar from the command line (:func:`gazeguard.runtime.service.serve`).

Reads the configuration (file < ``GAZEGUARD_*`` environment < flags), refuses it with every problem
listed when :func:`gazeguard.runtime.preflight.check_settings` finds any, serves on uvloop until
Ctrl-C / SIGTERM / ``--duration``, prints a banner, one line per charged chunk (not with
``--quiet``) and a summary on stderr, and exits with the :class:`~gazeguard.cli.ExitCode` its
:class:`~gazeguard.runtime.service.RunSummary` calls for (:func:`exit_code`).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from gazeguard.cli._common import (
    ExitCode,
    Signals,
    gaze_window,
    get_console,
    run_loop,
    stop_on_signals,
)
from gazeguard.cli.flags import add_settings_arguments, settings_overrides
from gazeguard.cli.watch import watch_hint
from gazeguard.config import Settings
from gazeguard.core.words import counted
from gazeguard.plan.labels import LabelPlan
from gazeguard.runtime.fleet import Fleet, SessionEvent
from gazeguard.runtime.labels import ReleasedLabel
from gazeguard.runtime.pipeline import Pipeline, ReleasedChunk
from gazeguard.runtime.preflight import check_settings
from gazeguard.runtime.service import RunSummary, serve, serve_fleet
from gazeguard.signal.events import LOOKBEHIND_S
from gazeguard.wire.message import VALUE_NOISE_LABEL, value_noise_text


def settings_from_args(args: argparse.Namespace, **extra: Any) -> Settings | None:
    """Settings from ``--config``, the environment and the flags (``extra`` overrides, by
    section, win over the flags); ``None`` after printing every problem when they are invalid."""
    overrides = settings_overrides(args)
    for section, values in extra.items():
        overrides[section] = {**overrides.get(section, {}), **values}
    settings, problems = check_settings(args.config, **overrides)
    console = get_console()
    for problem in problems:
        console.error(str(problem), **problem.as_dict())
    if settings is None or problems:
        return None
    return settings


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard run``."""
    parser.description = (
        "Run the privacy sidecar: read gaze from an LSL stream (or the simulated headset when "
        "none is configured), compute sliding-window features, privatize each chunk with "
        "DCFPA (or LPA/CFPA), charge it to the durable ε ledger, publish it over MQTT "
        "(an embedded broker when none is configured). Stops on Ctrl-C / SIGTERM. "
        "Exit status: 0 all delivered, 1 error, 3 chunks withheld (budget), 4 broker "
        "unreachable / chunks left in the outbox, 5 broker refused, 130 Ctrl-C (see "
        "`gazeguard --help`)."
    )
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    add_settings_arguments(parser)


def exit_code(summary: RunSummary) -> ExitCode:
    """The exit status a run's summary calls for (the highest that applies).

    * :attr:`ExitCode.REFUSED` — the broker permanently refused charged chunks (moved aside in
      the ledger), or refused the login while charged chunks are still in the outbox or no
      connection was ever made;
    * :attr:`ExitCode.UNDELIVERED` — the broker was never reached, or chunks are still pending;
    * :attr:`ExitCode.BUDGET` — chunks were withheld by a cap;
    * :attr:`ExitCode.OK` otherwise.
    """
    undelivered = summary.pending > 0 or summary.broker_connections == 0
    if summary.refused > 0 or (undelivered and summary.broker_refusals > 0):
        return ExitCode.REFUSED
    if undelivered:
        return ExitCode.UNDELIVERED
    if summary.stats.withheld > 0:
        return ExitCode.BUDGET
    return ExitCode.OK


def _banner(pipeline: Pipeline, endpoint: str, settings: Settings) -> None:
    every = pipeline.mechanism.n * settings.features.step_s
    # The first chunk: from the open to the grid, a window and the chunk's steps, then the
    # release's wait for the clock (late_after_s plus the detector's look-behind).
    to_grid = (
        0.0
        if pipeline.start_s is None or pipeline.opens_at is None
        else pipeline.start_s - pipeline.opens_at
    )
    wait = settings.ingest.late_after_s + LOOKBEHIND_S
    first = to_grid + settings.features.window_s + every + wait
    mech, plan, opened = pipeline.mechanism, pipeline.plan, pipeline.opened
    host, _, port = endpoint.rpartition(":")
    prefix = settings.broker.topic_prefix
    hint = watch_hint(host, int(port), prefix, pipeline.device, pipeline.session)
    cap = opened.session_cap
    if settings.mechanism.epsilon is None:
        how = f"noise calibrated to ε {opened.window_cap:g} per hour of gaze"
    else:
        how = f"fixed ε {settings.mechanism.epsilon:g} per feature per chunk"
        if opened.window_cap is not None:
            how += f", capped at ε {opened.window_cap:g} per hour of gaze"
    session_cap = "no session cap" if cap is None else f"session cap ε {cap:g}"
    sd, frac = mech.value_noise_sd(), mech.value_noise_range()
    shown = [
        f"{name} {value_noise_text(float(sd[i]), float(frac[i]), unit)}"
        for i, (name, unit) in enumerate(zip(pipeline.feature_names, pipeline.units, strict=True))
    ]
    more = f", … ({len(shown) - 6} more)" if len(shown) > 6 else ""
    chunk = plan.per_release["chunks"]
    pure = "" if plan.chunk_pure == float("inf") else f" (pure {plan.chunk_pure:.4g})"
    get_console().say(
        "banner",
        f"gazeguard: session {pipeline.session!r} → broker {endpoint}; "
        f"{mech.name}/{mech.transform} n={pipeline.chunker.n_steps} k={mech.k}, "
        f"{counted(len(pipeline.feature_names), 'feature')}, {mech.noise} noise. "
        f"First chunk in about {first:.0f} s, then one every {every:g} s, gaze or not.\n"
        f"  privacy (user-level, ε at δ {opened.delta:g}): {how}; {session_cap}.\n"
        f"  one chunk costs ε {chunk:.4g}{pure}; one raw gaze sample reaches "
        f"{counted(plan.chunks.per_sample, 'chunk')}: ε {plan.per_sample:.4g} (every release "
        f"kind); an hour of gaze reaches {counted(plan.chunks.per_hour, 'chunk')}: ε "
        f"{plan.per_hour:.4g}.\n"
        f"  {VALUE_NOISE_LABEL} per published value (value_noise_sd: standard deviation, in the "
        f"feature's units and × its public range, before clipping to that range; noise "
        f"multiplier {float(mech.noise_multiplier.max()):.4g}): "
        f"{', '.join(shown[:6])}{more}.\n"
        f"  each chunk carries {pipeline.carries}."
        + ("" if pipeline.label_plan is None else "\n  " + pipeline.label_plan.text())
        + "\n  "
        + hint,
        session=pipeline.session,
        broker=endpoint,
        mechanism=mech.name,
        transform=mech.transform,
        noise=mech.noise,
        n=pipeline.chunker.n_steps,
        k=int(mech.k),
        features=len(pipeline.feature_names),
        chunk_epsilon=chunk,
        chunk_pure_epsilon=None if plan.chunk_pure == float("inf") else plan.chunk_pure,
        raw_event_epsilon=plan.per_sample,
        chunks_reached=plan.chunks.per_sample,
        window_epsilon=plan.per_hour,
        hour_chunks=plan.chunks.per_hour,
        window_cap=opened.window_cap,
        window_s=opened.window_s,
        delta=opened.delta,
        session_cap=cap,
        value_noise_sd=dict(zip(pipeline.feature_names, sd.tolist(), strict=True)),
        value_noise_range=dict(zip(pipeline.feature_names, frac.tolist(), strict=True)),
        profile=pipeline.profile,
        **({} if pipeline.label_plan is None else _label_fields(pipeline.label_plan)),
    )


def _label_fields(plan: LabelPlan) -> dict[str, Any]:
    """The label plan's figures for the banner's JSON form."""
    return {
        "label_model": f"{plan.model.name} v{plan.model.version}",
        "label_classes": list(plan.model.classes),
        "label_epsilon": plan.epsilon,
        "label_survival": plan.survival,
        "decision_s": plan.decision_s,
        "label_decisions_per_hour": plan.per_window,
        "label_reserve_per_hour": plan.reserve,
        "label_clean_accuracy": plan.clean_accuracy,
        "label_released_accuracy": plan.released_accuracy,
    }


def _progress(out: ReleasedChunk, connected: bool) -> None:
    led = out.message.ledger
    remaining = "uncapped" if led.remaining is None else f"{led.remaining:.4g} left"
    hour = "" if led.window_cap is None else f" of {led.window_cap:g}"
    get_console().progress(
        "chunk",
        f"chunk {out.message.chunk_index:>5} charged: session ε {led.epsilon:.4g} "
        f"({remaining}), last {gaze_window(led.window_s)} ε {led.epsilon_window:.4g}{hour}"
        + (f" → {out.topic}" if connected else ", queued (broker down)"),
        chunk_index=out.message.chunk_index,
        chunk_epsilon=led.chunk_epsilon,
        session_epsilon=led.epsilon,
        window_epsilon=led.epsilon_window,
        session_spent=led.session_spent,
        remaining=led.remaining,
        topic=out.topic,
        queued=not connected,
    )


def _label_progress(out: ReleasedLabel, connected: bool) -> None:
    """One line per charged label, as :func:`_progress` is per chunk."""
    m, led = out.message, out.state
    remaining = "uncapped" if led.remaining is None else f"{led.remaining:.4g} left"
    right = m.right_probability
    odds = (
        f"right with probability {right:.2f}"
        if right is not None
        else f"the model's label with probability {m.survival_probability:.2f}"
    )
    get_console().progress(
        "label",
        f"label {m.decision_index:>5} charged: {m.label!r} ({odds}, ε {m.epsilon:.3g}); session "
        f"ε {led.epsilon:.4g} ({remaining})"
        + (f" → {out.topic}" if connected else ", queued (broker down)"),
        decision_index=m.decision_index,
        label=m.label,
        label_epsilon=m.epsilon,
        right_probability=right,
        session_epsilon=led.epsilon,
        remaining=led.remaining,
        topic=out.topic,
        queued=not connected,
    )


def run(args: argparse.Namespace) -> int:
    """``gazeguard run``: serve until stopped; the exit status from :func:`exit_code`."""
    settings = settings_from_args(args)
    if settings is None:
        return ExitCode.ERROR
    if settings.fleet.enabled:
        return _run_fleet(settings, args.duration)
    console = get_console()

    async def main() -> tuple[RunSummary, Signals]:
        stop = asyncio.Event()
        signals = stop_on_signals(stop)
        summary = await serve(
            settings,
            duration_s=args.duration,
            stop=stop,
            on_progress=None if console.quiet else _progress,
            on_label=None if console.quiet else _label_progress,
            ready=lambda p, ep: _banner(p, ep, settings),
        )
        return summary, signals

    summary, signals = run_loop(main())
    s = summary.stats
    remaining = "no cap" if summary.remaining is None else f"{summary.remaining:.6g} remaining"
    code = exit_code(summary)
    why = {
        ExitCode.OK: "",
        ExitCode.BUDGET: "; chunks were withheld: the budget cap was reached",
        ExitCode.UNDELIVERED: f"; broker {summary.broker} "
        + ("never reached" if summary.broker_connections == 0 else "did not take every chunk")
        + (f" ({summary.broker_error})" if summary.broker_error else ""),
        ExitCode.REFUSED: f"; broker {summary.broker} refused"
        + (
            f" {counted(summary.refused, 'chunk')} (see gazeguard ledger show)"
            if summary.refused
            else ""
        )
        + f": {summary.broker_error}",
    }.get(code, "")
    console.say(
        "summary",
        f"gazeguard: session {summary.session!r}: {counted(s.released, 'chunk')} released, "
        f"{s.withheld} withheld, {s.dropped} dropped, "
        f"{counted(s.tail_steps_dropped, 'tail step')} dropped"
        + f"; user-level ε {summary.spent:.4g} ({remaining}); "
        f"{counted(summary.pending, 'chunk')} still in the outbox"
        + _backlog_summary(summary)
        + _label_summary(summary)
        + f"; ledger {summary.ledger}{why} "
        + (
            f"(exit status {int(ExitCode.INTERRUPTED)}: Ctrl-C"
            + ("" if code == ExitCode.OK else f"; {int(code)} otherwise")
            + ")"
            if signals.interrupted
            else f"(exit status {int(code)})"
        ),
        session=summary.session,
        released=s.released,
        withheld=s.withheld,
        dropped=s.dropped,
        spent=summary.spent,
        remaining=summary.remaining,
        pending=summary.pending,
        delivered=summary.delivered,
        backlog=summary.backlog,
        backlog_sent=summary.backlog_sent,
        broker_connections=summary.broker_connections,
        broker_refusals=summary.broker_refusals,
        exit_status=int(ExitCode.INTERRUPTED if signals.interrupted else code),
        **_label_fields_of(summary),
    )
    return ExitCode.INTERRUPTED if signals.interrupted else code


def _backlog_summary(summary: RunSummary) -> str:
    """What became of the releases an earlier run left in the outbox (empty when none)."""
    if summary.backlog == 0:
        return ""
    left = summary.backlog - summary.backlog_sent
    return (
        f"; of the {counted(summary.backlog, 'release')} an earlier run left in the outbox, "
        f"{summary.backlog_sent} sent" + (f", {left} still waiting" if left else "")
    )


def _label_summary(summary: RunSummary) -> str:
    """The labels of a run for the summary line (empty without labels): how many, how often
    the label changed, and their ε."""
    lab = summary.labels
    if lab is None or summary.label_epsilon is None:
        return ""
    return (
        f"; {counted(lab.released, 'label')} (on a clock), the label changed "
        f"{counted(lab.switches, 'time')}, "
        f"{lab.withheld} withheld, {lab.dropped} dropped; the labels' ε "
        f"{summary.label_epsilon:.4g} (within the user-level ε)"
    )


def _label_fields_of(summary: RunSummary) -> dict[str, Any]:
    """The summary's label counters for its JSON form (empty without labels)."""
    lab = summary.labels
    if lab is None:
        return {}
    return {
        "labels_released": lab.released,
        "label_switches": lab.switches,
        "labels_withheld": lab.withheld,
        "labels_dropped": lab.dropped,
        "labels_epsilon": summary.label_epsilon,
    }


def _fleet_banner(settings: Settings, fleet: Fleet) -> None:
    """What a worker serves, where it publishes and what each person pays, once at startup."""
    led = settings.ledger
    budget = (
        "no hourly budget"
        if led.budget_per_hour is None
        else f"ε {led.budget_per_hour:g} per hour of gaze"
        + (" and of wall-clock time" if led.wall_clock else "")
        + f" per person at δ {led.delta:g}"
    )
    console = get_console()
    fleet.on_session = _session_line
    console.say(
        "startup",
        f"gazeguard fleet worker {fleet.worker_id}: {settings.ingest.source} sessions, "
        f"privatized releases to {fleet.publisher.endpoint}; {budget}",
        worker=fleet.worker_id,
    )
    if fleet.cohort is not None and led.budget_per_hour is not None:
        plan = fleet.cohort.aggregator.plan
        share = settings.cohort.budget_share
        console.say(
            "startup",
            f"cohort {settings.cohort.name!r}: {share:.0%} of the hourly budget (ε "
            f"{plan.budget:g} at δ {plan.delta:g}) goes to the aggregates, each session's chunks "
            f"are calibrated to the rest at δ {plan.delta:g}; {plan.text()}",
            cohort=settings.cohort.name,
            sigma=plan.sigma,
        )


def _session_line(event: SessionEvent) -> None:
    """One line per session a fleet worker opens or closes."""
    what = (
        f"→ {event.topic}"
        if event.event == "opened"
        else f"({counted(event.samples, 'sample')}, {counted(event.released, 'chunk')} released)"
    )
    get_console().progress(
        "session",
        f"session {event.session} of device {event.device} {event.event} {what}",
        session=event.session,
        device=event.device,
        state=event.event,
        topic=event.topic,
        samples=event.samples,
        released=event.released,
    )


def _run_fleet(settings: Settings, duration_s: float | None) -> int:
    async def main() -> tuple[Fleet, Signals]:
        stop = asyncio.Event()
        signals = stop_on_signals(stop)
        fleet = await serve_fleet(
            settings,
            duration_s=duration_s,
            stop=stop,
            ready=lambda fleet: _fleet_banner(settings, fleet),
        )
        return fleet, signals

    fleet, signals = run_loop(main())
    get_console().say(
        "summary",
        f"gazeguard fleet worker {fleet.worker_id}: {counted(len(fleet.closed), 'session')} "
        "served, "
        f"{len(fleet.sessions)} open at exit, {fleet.refused} refused",
        worker=fleet.worker_id,
        served=len(fleet.closed),
        open=len(fleet.sessions),
        refused=fleet.refused,
    )
    return ExitCode.INTERRUPTED if signals.interrupted else ExitCode.OK
