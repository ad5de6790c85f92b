"""How useful and how private the cohort's attention release is (``bench/eval_attention.py``).

The mechanism is the worker's own (:mod:`gazeguard.runtime.cohort`,
:mod:`gazeguard.signal.attention`):
each session's bucket tally normalized into its grid and AOI blocks, their exact sum, one
discrete Gaussian of the release plan's σ per coordinate (:meth:`gazeguard.plan.ReleasePlan.
build` with ``cohort.release``), the message's post-processing (positive part, normalised).
Noise here comes from a seeded source (reproducible results; NOT private noise).

* **Population.** ``max(sizes)`` simulated people (:func:`gazeguard.runtime.simulate.
  simulate_scene_gaze`: person ``POPULATION_SEED + i``, task ``TASKS[i mod 4]``, each task's
  content at its own place in the scene), one ``bucket_s`` bucket each at ``rate_hz``. A cohort
  of N is the first N (every task equally often).
* **Heatmap error.** Earth mover's distance, in degrees of gaze angle, between the released
  heatmap (as published: the noisy grid's positive part, normalised; beside it the projection
  onto the simplex of its noisy total, for comparison) and the clean cohort heatmap (the
  normalised sum of the same blocks without noise), over the cell centres
  (:func:`heatmap_emd`); beside it the total-variation distance (½·L1, a share of the dwell
  misplaced). Reference points: a uniform heatmap's EMD to the clean one (what a release that
  says nothing scores), and the EMD between two disjoint halves of the clean cohort (sampling
  noise of the cohort itself).
* **AOI dwell-share error.** Mean and largest absolute error of the released AOI shares
  (``elsewhere`` included), percentage points.
* **Re-identification.** The informed attacker DP is about: it knows every other member's
  contribution exactly (they cancel) and the contributions of K candidates, one of whom is in
  the cohort, in each bucket of an hour; it picks the maximum-likelihood candidate (for
  Gaussian noise, least squares summed over the buckets it sees). Measured after one bucket
  and after the plan's full hour of buckets (each candidate's own gaze in every bucket: a new
  realisation of the same person and task). It does not depend on N.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.stats import wasserstein_distance_nd

from gazeguard.config import CohortSettings
from gazeguard.plan import ReleasePlan
from gazeguard.plan.cohort import CohortPart
from gazeguard.privacy.mechanisms.randomness import random_source
from gazeguard.runtime.cohort import exact_sum, privatize_sum
from gazeguard.runtime.simulate import TASKS, simulate_scene_gaze
from gazeguard.signal.attention import AttentionGrid, AttentionLayout, load_aois, shares

FloatArray = npt.NDArray[np.float64]

#: Cohort sizes and user-level budgets (ε per hour of gaze) measured by default.
SIZES = (10, 30, 100, 1000)
BUDGETS = (1.0, 10.0, 100.0)
#: Seed offset of the simulated population.
POPULATION_SEED = 200_000


def demo_aoi_path() -> str:
    """The shipped demo AOI file's path (``gazeguard/data/attention/demo_aois.json``: its areas
    sit where the simulated tasks' content is)."""
    from importlib import resources  # noqa: PLC0415

    return str(resources.files("gazeguard").joinpath("data", "attention", "demo_aois.json"))


def cell_centres(grid: AttentionGrid) -> FloatArray:
    """(R·C, 2) each cell's centre ``[x, y]``, deg, in the grid's cell order (row 0 on top)."""
    w, h = grid.width_deg / grid.cols, grid.height_deg / grid.rows
    rows, cols = np.divmod(np.arange(grid.cells), grid.cols)
    return np.column_stack(
        [-grid.width_deg / 2 + (cols + 0.5) * w, grid.height_deg / 2 - (rows + 0.5) * h]
    )


def heatmap_emd(p: npt.ArrayLike, q: npt.ArrayLike, grid: AttentionGrid) -> float:
    """Earth mover's distance between two heatmaps (R·C,) (each normalised inside), deg: the
    least mean distance dwell must move to turn one into the other. An all-zero heatmap is
    taken as uniform (a release that says nothing)."""
    a, b = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (p, q))
    a = a / a.sum() if a.sum() > 0 else np.full(a.size, 1 / a.size)
    b = b / b.sum() if b.sum() > 0 else np.full(b.size, 1 / b.size)
    xy = cell_centres(grid)
    return float(wasserstein_distance_nd(xy, xy, a, b))


def total_variation(p: npt.ArrayLike, q: npt.ArrayLike) -> float:
    """½·L1 between two distributions (share of the mass misplaced)."""
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def tallies(
    layout: AttentionLayout, people: int, *, buckets: int = 1, bucket_s: float = 60.0,
    rate_hz: float = 60.0, first: int = 0,
) -> npt.NDArray[np.int64]:  # fmt: skip
    """(people, buckets, tally) simulated tallies: person ``first + i`` doing task
    ``TASKS[(first + i) mod 4]``, bucket ``b`` its session ``b``."""
    out = np.zeros((people, buckets, layout.tally_size), dtype=np.int64)
    for i in range(people):
        k = first + i
        for b in range(buckets):
            g = simulate_scene_gaze(
                bucket_s, rate_hz, POPULATION_SEED + k, TASKS[k % len(TASKS)], session=b
            )
            out[i, b] = layout.tally(g.x_deg, g.y_deg, g.valid)
    return out


def plan_for(budget: float, release: Sequence[str], *, bucket_s: float, aois: str) -> ReleasePlan:
    """The release plan of a fleet releasing ``release`` at ``budget`` ε per hour (cohort share
    0.5, δ = 1e-6)."""
    cohort = CohortSettings(
        enabled=True, bucket_s=bucket_s, release=list(release),
        attention_aois=aois if "aois" in release else None,
    )  # fmt: skip
    return ReleasePlan.build(budget=budget, delta=1e-6, cohort=cohort)


def _split(layout: AttentionLayout, v: FloatArray) -> tuple[FloatArray, FloatArray]:
    g = layout.grid_cells
    return v[..., :g], v[..., g:]


def utility(
    layout: AttentionLayout, part: CohortPart, blocks: FloatArray, *, trials: int, seed: int
) -> dict[str, Any]:
    """Heatmap and AOI errors of ``trials`` releases of the sum of ``blocks`` (N, D)."""
    assert layout.grid is not None
    total = exact_sum(blocks)
    clean_grid, clean_aoi = _split(layout, total)
    clean_heat, clean_share = shares(clean_grid), shares(clean_aoi)
    source = random_source(seed)
    emd, emd_proj, tv, mae, worst = [], [], [], [], []
    for _ in range(trials):
        noisy = privatize_sum(part, total, source)
        grid, aoi = _split(layout, noisy)
        heat = shares(grid)  # as published: the positive part, normalised
        emd.append(heatmap_emd(heat, clean_heat, layout.grid))
        emd_proj.append(heatmap_emd(shares(grid, float(grid.sum())), clean_heat, layout.grid))
        tv.append(total_variation(heat, clean_heat))
        if aoi.size:
            err = np.abs(shares(aoi) - clean_share) * 100
            mae.append(float(err.mean()))
            worst.append(float(err.max()))
    out: dict[str, Any] = {
        "heatmap_emd_deg": float(np.mean(emd)),
        "heatmap_emd_deg_p90": float(np.quantile(emd, 0.9)),
        "heatmap_tv": float(np.mean(tv)),
        "heatmap_emd_deg_projected": float(np.mean(emd_proj)),
    }
    if mae:
        out |= {
            "aoi_share_mae_pp": float(np.mean(mae)),
            "aoi_share_max_err_pp": float(np.mean(worst)),
        }
    return out


def reidentify(
    layout: AttentionLayout,
    part: CohortPart,
    candidates: FloatArray,
    *,
    hours_buckets: int,
    trials: int,
    seed: int,
) -> dict[str, float]:
    """Accuracy of the informed attacker's maximum-likelihood guess among K candidates
    (``candidates``: (K, H, D) their blocks in each of H ≥ ``hours_buckets`` buckets), after
    one bucket and after ``hours_buckets``."""
    k = candidates.shape[0]
    source = random_source(seed)
    rng = np.random.default_rng(seed)
    right_one = right_hour = 0
    for _ in range(trials):
        truth = int(rng.integers(k))
        noisy = np.stack(
            [privatize_sum(part, candidates[truth, h], source) for h in range(hours_buckets)]
        )
        d = ((noisy[None, :, :] - candidates[:, :hours_buckets, :]) ** 2).sum(axis=2)
        right_one += int(np.argmin(d[:, 0]) == truth)
        right_hour += int(np.argmin(d.sum(axis=1)) == truth)
    return {
        "candidates": k,
        "chance": 1 / k,
        "one_bucket": right_one / trials,
        "one_hour": right_hour / trials,
        "buckets_per_hour": hours_buckets,
    }


def evaluate_attention(
    sizes: Sequence[int] = SIZES,
    budgets: Sequence[float] = BUDGETS,
    *,
    trials: int = 20,
    reid_trials: int = 200,
    candidates: int = 10,
    bucket_s: float = 60.0,
    rate_hz: float = 60.0,
    seed: int = 1,
) -> dict[str, Any]:
    """The evaluation (module docstring) as one JSON-ready dict."""
    started = time.perf_counter()
    aois = demo_aoi_path()
    layout = AttentionLayout(AttentionGrid(), load_aois(aois))
    grid_only = AttentionLayout(layout.grid, None)
    people = max(sizes)
    pop = tallies(layout, people, bucket_s=bucket_s, rate_hz=rate_hz)[:, 0]
    blocks = np.stack([layout.contribution(t) for t in pop])
    g = layout.grid_cells
    assert layout.grid is not None
    # reference points: a uniform heatmap; two disjoint halves of the largest cohort
    clean = shares(exact_sum(blocks[:people, :g]))
    half = people // 2
    halves = heatmap_emd(exact_sum(blocks[:half, :g]), exact_sum(blocks[half:, :g]), layout.grid)
    results: list[dict[str, Any]] = []
    reid: list[dict[str, Any]] = []
    plans: list[dict[str, Any]] = []
    for budget in budgets:
        for release in (("attention",), ("attention", "aois")):
            plan = plan_for(budget, release, bucket_s=bucket_s, aois=aois)
            assert plan.cohort_plan is not None
            part = plan.cohort_plan.part("attention")
            assert part is not None
            lay = layout if "aois" in release else grid_only
            dims = slice(None) if "aois" in release else slice(0, g)
            plans.append(
                {
                    "budget_per_hour": budget,
                    "release": list(release),
                    "cohort_epsilon_per_hour": plan.cohort_plan.epsilon_per_hour,
                    "epsilon_per_hour": plan.per_hour,
                    "buckets_per_hour": plan.cohort_plan.buckets_per_hour,
                    "sensitivity_l2": part.sensitivity_l2,
                    "sigma": part.sigma,
                    "delta": plan.delta,
                }
            )
            for n in sizes:
                row = utility(lay, part, blocks[:n, dims], trials=trials, seed=seed + n)
                results.append(
                    {"budget_per_hour": budget, "release": list(release), "sessions": n} | row
                )
    # re-identification: K candidates over an hour of buckets, the grid-only plan
    hour = plans[0]["buckets_per_hour"]
    cand = tallies(
        grid_only, candidates, buckets=hour, bucket_s=bucket_s, rate_hz=rate_hz, first=people
    )
    cand_blocks = np.stack([[grid_only.contribution(t) for t in c] for c in cand])
    for budget in budgets:
        plan = plan_for(budget, ("attention",), bucket_s=bucket_s, aois=aois)
        assert plan.cohort_plan is not None
        part = plan.cohort_plan.part("attention")
        assert part is not None
        r = reidentify(
            grid_only, part, cand_blocks, hours_buckets=hour, trials=reid_trials, seed=seed
        )
        reid.append(
            {
                "budget_per_hour": budget,
                "cohort_epsilon_per_hour": plan.cohort_plan.epsilon_per_hour,
            }
            | r
        )
    uniform = heatmap_emd(np.ones(g), clean, layout.grid)
    return {
        "setup": {
            "grid": [layout.grid.rows, layout.grid.cols],
            "fov_deg": [layout.grid.width_deg, layout.grid.height_deg],
            "aois": list(layout.aois.names) if layout.aois else [],
            "bucket_s": bucket_s,
            "rate_hz": rate_hz,
            "tasks": list(TASKS),
            "people": people,
            "trials": trials,
            "dwell": "valid samples, time-weighted at the declared rate",
            "noise": "seeded (reproducible evaluation, not private)",
            "cohort_share": 0.5,
        },
        "reference": {
            "uniform_heatmap_emd_deg": uniform,
            "half_vs_half_emd_deg": halves,
            "clean_aoi_shares": dict(
                zip(
                    [*(layout.aois.names if layout.aois else ()), "elsewhere"],
                    shares(exact_sum(blocks[:, g:])).round(4).tolist(),
                    strict=True,
                )
            ),
        },
        "plans": plans,
        "utility": results,
        "reidentification": reid,
        "seconds": time.perf_counter() - started,
    }
