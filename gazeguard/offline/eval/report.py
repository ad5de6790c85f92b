"""Evaluation output: one JSON with every number, Markdown tables in the paper's layout, PNG plots.

Tables follow Bozkir et al. 2021: rows are mechanisms, columns the ε grid, each cell
``k-NN | SVM | DT | RF``. Each table states the clean baseline and the chance level, and each row
the factor that turns the per-chunk ε into the honest user-level ε of one whole recording
(``ε_user = ε × F × chunks``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gazeguard.offline.eval.attacks import CLASSIFIER_LABELS
from gazeguard.offline.eval.grid import RELEASE_FAMILIES
from gazeguard.privacy.mechanisms.registry import MECHANISMS

Result = dict[str, Any]


def json_safe(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, tuples → lists, numpy scalars → Python, floats rounded
    to 4 significant digits (finer than the repetition-to-repetition spread)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float):
        return float(f"{obj:.4g}") if math.isfinite(obj) else None
    if hasattr(obj, "item"):
        return json_safe(obj.item())
    return obj


def comma_lines(lines: Sequence[str]) -> list[str]:
    """``lines`` with a comma after each but the last (the items of a JSON list or object)."""
    return [line + ("," if j < len(lines) - 1 else "") for j, line in enumerate(lines)]


def json_rows(rows: Sequence[Any]) -> list[str]:
    """The items of a JSON list, one a line: each of ``rows`` as JSON after a space."""
    return comma_lines([" " + json.dumps(r, ensure_ascii=False) for r in rows])


def write_json(results: Sequence[Result], path: Path) -> Path:
    """Write every dataset's results as one JSON document ``{"datasets": [...]}``: one line per
    result row (and per correlation feature), so the file stays small and diffs stay readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ['{"datasets": [']
    for i, res in enumerate(results):
        clean = json_safe(res)
        head = {k: v for k, v in clean.items() if k not in ("rows", "correlation")}
        corr = clean["correlation"]
        lines.append(json.dumps(head, ensure_ascii=False)[:-1] + ', "correlation": {')
        lines.append(f' "max_lag": {corr["max_lag"]}, "step_s": {corr["step_s"]}, "features": {{')
        feats = list(corr["features"].items())
        lines += comma_lines(
            [f"  {json.dumps(n)}: {json.dumps(v, ensure_ascii=False)}" for n, v in feats]
        )
        lines.append(' }}, "rows": [')
        lines += json_rows(clean["rows"])
        lines.append("]}" + ("," if i < len(results) - 1 else ""))
    lines.append("]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def read_json(path: Path) -> list[Result]:
    """The per-dataset results of a file written by :func:`write_json`."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return list(data["datasets"])


def _num(v: float | None, digits: int = 2) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _cell(row: Result, what: str, view: str, mode: str, classifiers: Sequence[str]) -> str:
    per = (row.get(what) or {}).get(view, {})
    if not per:
        return "–"
    return r" \| ".join(_num(per[c][mode]["mean"]) if c in per else "–" for c in classifiers)


def _rows_by_mechanism(result: Result) -> dict[str, dict[float, Result]]:
    """Stream-mechanism rows (LPA/FPA/CFPA/DCFPA) by mechanism and ε."""
    out: dict[str, dict[float, Result]] = {}
    for row in result["rows"]:
        if row["family"] not in ("none", *RELEASE_FAMILIES) and "error" not in row:
            out.setdefault(row["mechanism"], {})[row["epsilon"]] = row
    return out


def _label(rows: dict[float, Result]) -> str:
    return str(next(iter(rows.values()))["label"])


def _axis(result: Result) -> str:
    """What the ε grid means in this run."""
    if result["meta"].get("axis") == "per-hour":
        family = result["meta"].get("noise_family")
        return f"user-level ε per hour of gaze at δ 1e-6 ({family} noise)"
    return "ε per feature per chunk"


def _multiplier(rows: dict[float, Result]) -> str:
    m = (next(iter(rows.values())).get("epsilon_user") or {}).get("multiplier_max")
    return f"×{m:.3g}" if m else "no release"


def clean_row(result: Result) -> Result | None:
    return next((r for r in result["rows"] if r["family"] == "none"), None)


def _accuracy_table(
    result: Result, *, what: str, view: str, mode: str, title: str, chance: float | None
) -> list[str]:
    meta = result["meta"]
    clfs = meta["classifiers"]
    eps = meta["epsilons"]
    head = " \\| ".join(CLASSIFIER_LABELS[c] for c in clfs)
    lines = [f"**{title}** ({head}; mean over {meta['clf_reps']} noisy repetitions)", ""]
    clean = clean_row(result)
    base = _cell(clean, what, "release", mode, clfs) if clean else "–"
    lines.append(
        f"Clean baseline: {base}; chance {_num(chance)}. {_axis(result)}; "
        "user-level ε of one recording = ε × the factor in the last column."
    )
    lines.append("")
    lines.append("| Method | " + " | ".join(f"ε={e:g}" for e in eps) + " | ε_user/ε |")
    lines.append("|---" * (len(eps) + 2) + "|")
    marked = False
    for rows in _rows_by_mechanism(result).values():
        cells = [_cell(rows[e], what, view, mode, clfs) if e in rows else "–" for e in eps]
        shared = what != "task" and any(r.get("split_inside_chunk") for r in rows.values())
        marked |= shared
        label = _label(rows) + (" †" if shared else "")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_multiplier(rows)} |")
    if marked:
        lines += [
            "",
            "† The train/test cut falls inside one released chunk for some recordings (always "
            "for FPA: one release per recording): the same noise draw is on both sides, so the "
            "attack links two halves of one noisy release rather than recognising a person.",
        ]
    lines.append("")
    return lines


def _utility_table(result: Result) -> list[str]:
    eps = result["meta"]["epsilons"]
    lines = [
        f"**Utility 1/|NMSE|** (mean over features of the mean over recordings and "
        f"{result['meta']['utility_reps']} noisy repetitions; higher is better) and, in "
        "brackets, RMSE as a fraction of the feature's public range",
        "",
        "| Method | " + " | ".join(f"ε={e:g}" for e in eps) + " | ε_user/ε |",
        "|---" * (len(eps) + 2) + "|",
    ]
    for rows in _rows_by_mechanism(result).values():
        cells = []
        for e in eps:
            u = rows[e]["utility"] if e in rows else None
            cells.append(f"{_num(u['mean'], 3)} ({_num(u['rmse_over_range'], 3)})" if u else "–")
        lines.append(f"| {_label(rows)} | " + " | ".join(cells) + f" | {_multiplier(rows)} |")
    lines.append("")
    return lines


def _best_lines(result: Result) -> list[str]:
    meta = result["meta"]
    lines = [
        f"**Best configuration** — re-identification at chance (≤ {meta['chance_reid']:.3f} + "
        f"{meta['tolerance']:.2f}, strongest classifier) with the highest task accuracy:",
        "",
    ]
    names = {
        "bozkir": "Bozkir protocol (train and test on the release; task leave one person out), "
        "per window",
        "bozkir_with_vote": "Bozkir protocol, per window and after majority vote",
        "david_john": "David-John protocol (train on the release of first halves, test on raw "
        "second halves; task across halves)",
    }
    for key, text in names.items():
        b = result["best"].get(key)
        if b is None:
            lines.append(
                f"- {text}: none useful (no configuration has re-identification at chance and "
                "its task above chance)."
            )
            continue
        eu = (b.get("epsilon_user") or {}).get("max")
        eps = "" if b["epsilon"] is None else f", ε={b['epsilon']:g}"
        user = "" if eu is None else f" (user-level ε {eu:.4g})"
        lines.append(
            f"- {text}: **{b['label']}{eps}**{user}: task {b['task'][1]:.3f} "
            f"({CLASSIFIER_LABELS[b['task'][0]]}), re-identification {b['reid'][1]:.3f} "
            f"({CLASSIFIER_LABELS[b['reid'][0]]})"
        )
    lines.append("")
    return lines


def _release_table(result: Result) -> list[str]:
    rows = [r for r in result["rows"] if r["family"] in RELEASE_FAMILIES]
    if not rows:
        return []
    clfs = result["meta"]["classifiers"]
    head = " \\| ".join(CLASSIFIER_LABELS[c] for c in clfs)
    cols = [
        ("task", "release", "task LOPO, release"),
        ("task_half", "release", "task halves, release"),
        ("task_half", "raw", "task halves, raw (DJ)"),
        ("reid", "release", "re-id, release"),
        ("reid", "raw", "re-id, raw (DJ)"),
    ]
    lines = [
        f"**Dataset releases (David-John et al. 2022)** ({head}; per window; mean over "
        f"{result['meta']['clf_reps']} releases). *release*: trained and tested on the release "
        "of the whole table (for k-same and Marginals the held-out person is part of the "
        "release, so LOPO there is not a held-out test); *raw (DJ)*: trained on the release of "
        "the first halves, tested on the raw second halves.",
        "",
        "| Mechanism | ε | user-level ε | " + " | ".join(c[2] for c in cols) + " |",
        "|---" * (len(cols) + 3) + "|",
    ]
    for r in rows:
        eps = "–" if r["epsilon"] is None else f"{r['epsilon']:g}"
        if "error" in r:
            lines.append(f"| {r['label']} | {eps} | – | skipped: {r['error']} |")
            continue
        eu = (r.get("epsilon_user") or {}).get("max")
        cells = [_cell(r, what, view, "window", clfs) for what, view, _ in cols]
        user = "–" if eu is None else f"{eu:.4g}"
        lines.append(f"| {r['label']} | {eps} | {user} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _correlation_lines(result: Result) -> list[str]:
    feats = result["correlation"]["features"]
    lines = [
        "**Temporal correlation** — mean |autocorrelation| over lags 1–"
        f"{result['correlation']['max_lag']} steps within recordings, raw vs first difference:",
        "",
        "| Feature | raw | difference |",
        "|---|---|---|",
    ]
    for name, d in feats.items():
        lines.append(
            f"| {name} | {_num(d['mean_abs_acf_raw'], 3)} | {_num(d['mean_abs_acf_diff'], 3)} |"
        )
    lines.append("")
    return lines


def markdown(results: Sequence[Result]) -> str:
    """All tables of all datasets as one Markdown document."""
    out = ["# gazeguard privacy–utility evaluation", ""]
    for res in results:
        meta = res["meta"]
        out += [
            f"## {res['dataset']}",
            "",
            f"{len(meta['people'])} people, {len(meta['tasks'])} task(s), {meta['recordings']} "
            f"recordings, {meta['windows']} windows (W = {meta['window_s']:g} s, step "
            f"{meta['step_s']:g} s); {len(meta['features_released'])} features released; k = "
            f"{meta['k']}; noise: {meta['noise']}; task windows every {meta['every_task']}, "
            f"re-identification windows every {meta['every_reid']}.",
            "",
        ]
        if meta.get("sensitivity", "public") != "public":
            out += [f"**Sensitivity: {meta['sensitivity']}.**", ""]
        out += _utility_table(res)
        chance_t = meta["chance_task"]
        tables: list[tuple[str, str, str, str, float | None]] = []
        if chance_t is not None:
            tables += [
                ("task", "release", "window", "Task accuracy, leave one person out", chance_t),
                ("task", "release", "vote", "Task accuracy, majority vote per recording", chance_t),
            ]
        tables += [
            ("reid", "release", "window", "Person re-identification", meta["chance_reid"]),
            ("reid", "release", "vote", "Re-identification, majority vote", meta["chance_reid"]),
            (
                "reid",
                "raw",
                "window",
                "Re-identification, David-John protocol (train on the release, test on raw)",
                meta["chance_reid"],
            ),
        ]
        if chance_t is not None:
            tables.append(
                (
                    "task_half",
                    "raw",
                    "window",
                    "Task across halves, David-John protocol (train on the release of first "
                    "halves, test on raw second halves)",
                    chance_t,
                )
            )
        for what, view, mode, title, chance in tables:
            out += _accuracy_table(res, what=what, view=view, mode=mode, title=title, chance=chance)
        out += _release_table(res)
        if chance_t is not None:
            out += _best_lines(res)
        out += _correlation_lines(res)
    return "\n".join(out)


def write_markdown(results: Sequence[Result], path: Path) -> Path:
    """Write :func:`markdown` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(results) + "\n")
    return path


# ------------------------------------------------------------------ plots
def _style(key: str) -> dict[str, Any]:
    colors = {
        "lpa": "tab:gray",
        "fpa": "tab:purple",
        "cfpa-32": "tab:blue",
        "cfpa-64": "tab:cyan",
        "cfpa-128": "tab:olive",
        "dcfpa-32": "tab:red",
        "dcfpa-64": "tab:orange",
        "dcfpa-128": "tab:brown",
    }
    parts = key.split("-")
    base = "-".join(p for p in parts if p not in ("dft", "dct"))
    color = colors.get(base) or colors.get(parts[0], "black")
    return {"color": color, "linestyle": "--" if "dct" in parts else "-", "marker": "o", "ms": 3}


def _accuracy_figure(
    result: Result, *, what: str, view: str, title: str, chance: float | None, path: Path
) -> Path:
    import matplotlib as mpl  # noqa: PLC0415 - plotting is optional at import time

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    clfs = result["meta"]["classifiers"]
    fig, axes = plt.subplots(2, len(clfs), figsize=(4 * len(clfs), 7), sharey=True, squeeze=False)
    clean = clean_row(result)
    for r, mode in enumerate(("window", "vote")):
        for c, clf in enumerate(clfs):
            ax = axes[r][c]
            for key, rows in _rows_by_mechanism(result).items():
                eps = sorted(rows)
                ys = [rows[e].get(what, {}).get(view, {}).get(clf, {}).get(mode, {}) for e in eps]
                ax.plot(eps, [y.get("mean", math.nan) for y in ys], label=key, **_style(key))
            if chance is not None:
                ax.axhline(chance, color="black", lw=1.2, label="chance")
            if clean is not None:
                base = clean.get(what, {}).get("release", {}).get(clf, {}).get(mode, {})
                if "mean" in base:
                    ax.axhline(base["mean"], color="green", lw=1, ls=":", label="clean")
            ax.set_xscale("log")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{CLASSIFIER_LABELS[clf]} ({'majority vote' if r else 'per window'})")
            ax.set_xlabel(_axis(result))
            if c == 0:
                ax.set_ylabel("accuracy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.suptitle(f"{result['dataset']}: {title}")
    fig.tight_layout(rect=(0, 0, 0.9, 0.96))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _utility_figure(result: Result, path: Path) -> Path:
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for key, rows in _rows_by_mechanism(result).items():
        eps = sorted(rows)
        utils = [(rows[e]["utility"] or {}) for e in eps]
        axes[0].plot(eps, [u.get("mean") or math.nan for u in utils], label=key, **_style(key))
        axes[1].plot(
            eps, [u.get("rmse_over_range") or math.nan for u in utils], label=key, **_style(key)
        )
    axes[0].set(xscale="log", yscale="log", xlabel=_axis(result), ylabel="1/|NMSE|")
    axes[0].set_title("utility (paper eq. 6; higher is better)")
    axes[1].set(xscale="log", xlabel=_axis(result), ylabel="RMSE / public range")
    axes[1].set_title("error relative to the public range (lower is better)")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{result['dataset']}: utility vs ε")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _correlation_figure(result: Result, path: Path) -> Path | None:
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    feats: dict[str, Any] = result["correlation"]["features"]
    if not feats:
        return None
    preferred = [n for n in feats if "large_saccade" in n or "blink_rate" in n]
    ranked = sorted(feats, key=lambda n: -(feats[n]["mean_abs_acf_raw"] or 0.0))
    names = list(dict.fromkeys(preferred + ranked))[:4]
    step = result["correlation"]["step_s"]
    fig, axes = plt.subplots(2, len(names), figsize=(4 * len(names), 7), squeeze=False)
    for c, name in enumerate(names):
        d = feats[name]
        lags = [i * step for i in range(len(d["acf_raw"]))]
        ax = axes[0][c]
        ax.plot(lags, d["acf_raw"], label="raw", color="tab:blue")
        ax.plot(lags, d["acf_diff"], label="first difference", color="tab:red")
        ax.set(title=f"{name}\nautocorrelation within recordings", xlabel="lag, s", ylim=(-1, 1))
        ax.legend(fontsize=8)
        ax = axes[1][c]
        for task, ref in d["reference"].items():
            ax.plot(lags[: len(ref["raw"])], ref["raw"], color="tab:blue", alpha=0.6)
            ax.plot(lags[: len(ref["diff"])], ref["diff"], color="tab:red", alpha=0.6)
            del task
        ax.set(
            title="correlation across recordings vs step 5\n(blue raw, red difference; per task)",
            xlabel="Δt, s",
            ylim=(-1, 1),
        )
    fig.suptitle(f"{result['dataset']}: temporal correlation, raw vs difference signals")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def reid_and_task(row: Result) -> tuple[float, float] | None:
    """Strongest classifier's per-window re-identification and task accuracy on the release."""
    from gazeguard.offline.eval.runner import best_accuracy  # noqa: PLC0415 - runner imports this module

    reid = best_accuracy(row, "reid", "release", "window")
    task = best_accuracy(row, "task", "release", "window")
    return None if reid is None or task is None else (reid[1], task[1])


def tradeoff_points(result: Result) -> list[tuple[str, float | None, float, float]]:
    """``(mechanism key, ε, re-identification, task)`` of every stream-mechanism row: the
    strongest classifier's per-window accuracy on the release (the criterion of the best
    configuration; dataset releases are left out, as there: leave-one-person-out on a release
    that mixes the held-out person in is no held-out test; so are rows whose train/test cut
    falls inside one release, marked † in the tables)."""
    points = []
    for row in result["rows"]:
        if row["family"] in ("none", *RELEASE_FAMILIES) or "error" in row:
            continue
        if row.get("split_inside_chunk"):  # FPA: one noise draw on both halves (see † tables)
            continue
        scores = reid_and_task(row)
        if scores is not None:
            points.append((str(row["mechanism"]), row["epsilon"], *scores))
    return points


def tradeoff_figure(runs: Sequence[tuple[str, Result]], path: Path) -> Path:
    """Task accuracy against re-identification for every row of one or more runs of the same
    dataset (e.g. public vs the paper's sensitivity), with each run's frontier (the best task at
    or below each re-identification level), chance and the clean baseline."""
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7.5, 6))
    colors = ("tab:blue", "tab:red", "tab:green", "tab:purple")
    markers = dict(zip(MECHANISMS, ("s", "D", "o", "^", "v", "P"), strict=False))
    first = runs[0][1]
    for i, (label, result) in enumerate(runs):
        color = colors[i % len(colors)]
        pts = tradeoff_points(result)
        for key, _eps, reid, task in pts:
            family = key.split("-")[0]
            ax.scatter(reid, task, s=18, color=color, marker=markers.get(family, "x"), alpha=0.6)
        frontier: list[tuple[float, float]] = []
        for _k, _e, reid, task in sorted(pts, key=lambda p: (p[2], -p[3])):
            if not frontier or task > frontier[-1][1]:
                frontier.append((reid, task))
        if frontier:
            xs, ys = zip(*frontier, strict=True)
            ax.step(xs, ys, where="post", color=color, lw=1.5, label=f"{label}: frontier")
    meta = first["meta"]
    clean = clean_row(first)
    clean_scores = None if clean is None else reid_and_task(clean)
    if clean_scores is not None:
        ax.scatter(*clean_scores, s=120, marker="*", color="black", label="clean", zorder=3)
    ax.axvline(meta["chance_reid"], color="black", lw=1, label="chance")
    ax.axvspan(0, meta["chance_reid"] + meta["tolerance"], color="0.9", zorder=0)
    if meta["chance_task"] is not None:
        ax.axhline(meta["chance_task"], color="black", lw=1)
    for family, marker in markers.items():
        ax.scatter([], [], marker=marker, color="0.4", label=family.upper())
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1),
        xlabel="person re-identification (strongest classifier, per window)",
        ylabel="task accuracy (strongest classifier, leave one person out)",
        title=f"{first['dataset']}: what a release keeps vs whom it reveals\n"
        "(shaded: re-identification at chance; every mechanism × ε is a point)",
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_plots(result: Result, out_dir: Path) -> list[Path]:
    """PNG plots of one dataset: utility, re-identification, task accuracy, task vs
    re-identification trade-off, correlation."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = result["dataset"]
    meta = result["meta"]
    paths = [_utility_figure(result, out_dir / f"{name}-utility.png")]
    figures: list[tuple[str, str, str, float | None, str]] = [
        ("reid", "release", "person re-identification vs ε", meta["chance_reid"], "reid"),
        (
            "reid",
            "raw",
            "re-identification, David-John protocol (train on the release, test on raw)",
            meta["chance_reid"],
            "reid-raw",
        ),
    ]
    if meta["chance_task"] is not None:
        figures.append(
            ("task", "release", "task accuracy (leave one person out)", meta["chance_task"], "task")
        )
    for what, view, title, chance, suffix in figures:
        paths.append(
            _accuracy_figure(
                result,
                what=what,
                view=view,
                title=title,
                chance=chance,
                path=out_dir / f"{name}-{suffix}.png",
            )
        )
    if meta["chance_task"] is not None:
        paths.append(tradeoff_figure([(name, result)], out_dir / f"{name}-tradeoff.png"))
    corr = _correlation_figure(result, out_dir / f"{name}-correlation.png")
    if corr is not None:
        paths.append(corr)
    return paths
