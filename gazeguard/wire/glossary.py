"""The glossary: every term that ``gazeguard watch``, ``run``'s banner and summary and ``gazeguard
demo`` print, defined once, with each feature's meaning, unit and public range.

``gazeguard watch --explain`` prints it (:func:`glossary_text`), and ``docs/glossary.md`` is the
same text as Markdown (:func:`glossary_markdown`; a test keeps the two equal; regenerate it with
``gazeguard watch --explain markdown > docs/glossary.md``).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from gazeguard.signal.features import FEATURES, feature_bounds

#: Feature bounds in the glossary are those of the defaults (30 s windows, 0.5 s steps).
WINDOW_S, STEP_S = 30.0, 0.5


@dataclass(frozen=True, slots=True)
class Term:
    """One entry: the words as printed, and what they mean."""

    term: str
    meaning: str


#: The glossary's sections: a title and its terms, in the order a newcomer meets them.
SECTIONS: tuple[tuple[str, tuple[Term, ...]], ...] = (
    (
        "Privacy figures (run's banner, watch's chunk lines, the status)",
        (
            Term(
                "ε (epsilon), δ (delta)",
                "The differential-privacy loss: how much any release can change with one "
                "person's gaze (ε, smaller is more private), except with a probability δ "
                "(ledger.delta, default 1e-6). gazeguard states every ε at that δ.",
            ),
            Term(
                "user-level ε",
                "The ε of everything released about one person's gaze, composed over every "
                "release (chunks, labels, cohort buckets) by the ledger's accountant; not the ε of "
                "one chunk.",
            ),
            Term(
                "session ε, user-level ε of the session",
                "The user-level ε of everything charged to the session so far "
                "(ledger.session_cap caps it).",
            ),
            Term(
                "last hour, per hour of gaze",
                "The user-level ε of the releases whose gaze lies in the trailing hour of gaze "
                "time; ledger.budget_per_hour caps it ('an hour of gaze plus its reach': the "
                "releases one hour of samples can change).",
            ),
            Term(
                "pure ε",
                "The plain sum of the ε of every release (sequential composition): a looser, "
                "conservative figure beside the accountant's.",
            ),
            Term(
                "one raw gaze sample reaches N chunks",
                "One sample lies in the 30 s windows of several feature vectors and so changes "
                "several chunks; its ε is the composition over those chunks (the raw-event ε).",
            ),
            Term(
                "charged",
                "Recorded in the ledger (its ε counted) before it is published; a release is "
                "charged once, even if it is delivered twice.",
            ),
            Term(
                "withheld",
                "Not released because a cap (the budget per hour, the session cap) would be "
                "exceeded; recorded in the ledger.",
            ),
            Term(
                "dropped",
                "Not released because of an error on its way (fail closed); recorded in the "
                "ledger, the error in the local log.",
            ),
            Term(
                "delivered, refused, still in the outbox",
                "The broker acknowledged it; the broker refused it for good (an ACL); charged but "
                "not yet acknowledged (sent on the next connection or start).",
            ),
        ),
    ),
    (
        "A chunk (watch's chunk lines)",
        (
            Term(
                "chunk",
                "n consecutive feature vectors of one session (n = mechanism.chunk_steps, 32; "
                "one vector per features.step_s, 0.5 s: 16 s of gaze), privatized together.",
            ),
            Term(
                "DCFPA, CFPA, LPA; dft, dct; k",
                "The mechanism: DCFPA privatizes the chunk's differences in the frequency domain "
                "(dft or dct) keeping the k lowest frequencies; CFPA the values themselves; LPA "
                "adds noise to each value.",
            ),
            Term(
                "carries",
                "What a consumer really receives per feature per chunk. With DCFPA at k = 1 (the "
                "default) it is one number, the chunk's net change from the feature's public "
                "lower bound, drawn as a straight ramp of n values from the lower bound to "
                "lower + net change: only the ramp's end carries information, the points along "
                "it are drawing.",
            ),
            Term(
                "lower, upper (lo, hi in the feature registry)",
                "A feature's public range: fixed bounds that do not depend on anyone's gaze "
                "(`gazeguard config features` lists them). Values are clipped to it; the noise "
                "comes from it.",
            ),
            Term(
                "min..max",
                "The least and greatest of the chunk's n published values of a feature.",
            ),
            Term(
                "⊥, ⊤",
                "After a value: it sits at the feature's public lower (⊥) or upper (⊤) bound, "
                "where clipping put it. '0⊥..0⊥': every value of the chunk sits at the lower "
                "bound (with DCFPA at k = 1 the noisy net change fell below the range, as it "
                "does about half the time when the noise sd is many times the range; far above "
                "it, every value sits at the upper bound: '5⊤..5⊤').",
            ),
            Term(
                "mean, last",
                "The mean of the chunk's n published values, and the last one (for DCFPA at "
                "k = 1, the one number it carries, clipped).",
            ),
            Term(
                "noise sd (value_noise_sd), × range",
                "The standard deviation of the noise on each published value, in the feature's "
                "unit, and as a multiple of its public range (upper − lower), before clipping. "
                "Above about 0.3× range a value is mostly noise.",
            ),
            Term(
                "noise multiplier",
                "The noise scale divided by the sensitivity (how much one person can change the "
                "release): what a budget buys.",
            ),
            Term(
                "sparkline (▁▂▃▄▅▆▇█)",
                "The chunk's n values drawn on the feature's public range, lowest to highest.",
            ),
        ),
    ),
    (
        "Labels (watch's label lines, run's label lines)",
        (
            Term(
                "label",
                "What the label model decides the person is doing in one decision block of gaze "
                "(labels.decision_s, 120 s), released by randomized response and held until the "
                "next.",
            ),
            Term(
                "randomized response, p (survival probability)",
                "The label is the model's with probability p and one of the other classes "
                "uniformly otherwise; p = e^ε / (e^ε + C − 1) over C classes.",
            ),
            Term(
                "right with probability",
                "p · acc + (1 − p)(1 − acc)/(C − 1): how often a released label is the person's "
                "real activity, with acc the model's clean accuracy on unseen people (its "
                "file). Chance is 1/C.",
            ),
            Term("replaces …, held for …", "The label before it and how long that one held."),
        ),
    ),
    (
        "Status (watch's status lines)",
        (
            Term(
                "starting, running, budget_exhausted, stream_lost, stopped",
                "The session's state: opened, no chunk charged yet; releasing; a cap withholds "
                "its releases; its stream went away; ended. watch shows a status when it "
                "changes (a sidecar republishes it every 5 s).",
            ),
            Term(
                "holds label … since …",
                "The label a consumer holds now for the session, and since when.",
            ),
        ),
    ),
    (
        "Cohort aggregates and receipts (fleet mode)",
        (
            Term(
                "bucket",
                "cohort.bucket_s of time (300 s) over which a fleet worker aggregates its "
                "sessions; one release per bucket.",
            ),
            Term(
                "mode (the group's activity)",
                "The activity most of the bucket's sessions were doing, as the label model "
                "reads them, chosen by permute-and-flip: right with a probability that grows "
                "with its lead; lead_for_90 is the lead, in sessions, at which it is right 9 "
                "times in 10.",
            ),
            Term(
                "about N sessions, noisy count",
                "The number of sessions in the bucket, with Gaussian noise (it is a released "
                "figure too).",
            ),
            Term(
                "± (95 % band)",
                "1.96 noise standard deviations: the true figure lies within it 95 % of the time.",
            ),
            Term(
                "readable, too noisy (needs ≥ N sessions)",
                "Whether the 95 % band is narrow enough to read the figure, and how many "
                "sessions per bucket it would take at this budget.",
            ),
            Term(
                "receipt",
                "A session's record that a cohort bucket was charged to it, with the ε per hour "
                "of buckets.",
            ),
        ),
    ),
    (
        "The demo's PNG (gazeguard demo)",
        (
            Term("raw (never published)", "The clean feature values inside the process."),
            Term(
                "privatized (published)",
                "The values as published. With DCFPA at k = 1 each chunk is a straight ramp from "
                "the feature's lower bound; only each ramp's end carries information, so read "
                "the ends, not the slopes.",
            ),
        ),
    ),
)

#: The saccade-direction wordbook, explained once (its 20 features share it).
WORDBOOK = Term(
    "wordbookN_distinct, _max, _min, _range, _mean",
    "The saccade-direction wordbook (Bulling et al. 2011). Each saccade in the 30 s window is a "
    "letter: one of 8 directions × 2 amplitudes (under or over 4°), 16 letters; an N-gram is N "
    "consecutive letters. _distinct counts the different N-grams that occurred, _max and _min "
    "how often the most and the least frequent occurring one did, _range is max − min and "
    "_mean the mean count over the occurring N-grams. wordbook2_mean 1.5: on average each pair "
    "of consecutive saccade directions that occurred, occurred 1.5 times in the window — high "
    "for repetitive scanning such as reading, low for varied looking. An empty wordbook (no "
    "saccade) is 0.",
)


def feature_terms() -> list[Term]:
    """Each of the 48 features: what it is, its unit and its public range at the defaults."""
    lo, hi, _ = feature_bounds([f.name for f in FEATURES], WINDOW_S, STEP_S)
    out = []
    for i, f in enumerate(FEATURES):
        unit = "none (a ratio)" if f.unit == "1" else f.unit
        meaning = f"{f.description}. Unit: {unit}; public range {lo[i]:.4g}..{hi[i]:.4g}."
        out.append(Term(f.name, meaning))
    return out


def glossary_text(width: int = 100) -> str:
    """The glossary for a terminal (``gazeguard watch --explain``)."""
    lines = ["gazeguard glossary: what watch, run and demo print", ""]
    features = (
        "Features (each chunk line's name; at 30 s windows and 0.5 s steps)",
        (WORDBOOK, *feature_terms()),
    )
    for title, terms in (*SECTIONS, features):
        lines += [title, ""]
        for t in terms:
            lines.append(f"  {t.term}")
            lines += textwrap.wrap(
                t.meaning, width, initial_indent="      ", subsequent_indent="      "
            )
        lines.append("")
    return "\n".join(lines)


def glossary_markdown() -> str:
    """The same glossary as Markdown (``docs/glossary.md``)."""
    lines = [
        "# Glossary",
        "",
        "Every term that `gazeguard watch`, `gazeguard run` (its banner, chunk and label lines and "
        "summary) and `gazeguard demo` print. `gazeguard watch --explain` prints the same text. "
        "Generated from `gazeguard/wire/glossary.py` (`gazeguard watch --explain markdown > "
        "docs/glossary.md`).",
        "",
    ]
    for title, terms in SECTIONS:
        lines += [f"## {title}", ""]
        lines += [f"- **{t.term}**: {t.meaning}" for t in terms]
        lines.append("")
    lines += [
        "## Features",
        "",
        "Each chunk line names a feature; at the defaults (30 s windows, 0.5 s steps):",
        "",
        f"- **{WORDBOOK.term}**: {WORDBOOK.meaning}",
        "",
        "| feature | what | unit | public range |",
        "|---|---|---|---|",
    ]
    lo, hi, _ = feature_bounds([f.name for f in FEATURES], WINDOW_S, STEP_S)
    lines += [
        f"| `{f.name}` | {f.description} | {f.unit} | {lo[i]:.4g}..{hi[i]:.4g} |"
        for i, f in enumerate(FEATURES)
    ]
    return "\n".join(lines) + "\n"
