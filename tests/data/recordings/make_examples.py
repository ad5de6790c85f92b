"""Write the example recordings of ``tests/offline/test_recordings.py`` and
``tests/offline/test_replay.py``.

    PYTHONPATH=. python tests/data/recordings/make_examples.py

Each file follows its vendor's documented layout (see README.md here) and holds a simulated
person (``gazeguard.runtime.simulate.simulate_gaze``) projected into the vendor's coordinates with
the
geometry written in ``GEOMETRY``; ``truth.npz`` keeps, per file, what a correct reader must
return: ``<name>__t`` (s), ``__x``/``__y`` (degrees, x right, y up; NaN where the sample is
invalid) and ``__pupil`` (mm; NaN where none). The files are committed, so the tests do not
depend on the simulator staying the same; run this script only to change them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gazeguard.runtime.simulate import simulate_gaze

HERE = Path(__file__).resolve().parent
GEOMETRY = {
    # Tobii Pro Spectrum-like setup: 24" 16:9 screen, 1920 x 1080, eyes 650 mm away.
    "tobii": {"screen_mm": [527.0, 296.0], "distance_mm": 650.0, "resolution_px": [1920, 1080]},
    # EyeLink 1000 desktop setup of the IRF recordings (db_config.json there).
    "eyelink": {"screen_mm": [533.0, 301.0], "distance_mm": 565.0, "resolution_px": [1920, 1080]},
    "eyelink_pupil_scale": 0.05,  # mm per sqrt(area unit) for the AREA file, per unit otherwise
    # Pupil Core world camera, 1280 x 720 (a wide lens; used only for the 2D-mapper export).
    "pupil_fov_deg": [99.0, 53.0],
}
truth: dict[str, np.ndarray] = {}


def person(duration: float, rate: float, seed: int, blink: tuple[float, float] | None):
    s = simulate_gaze(duration, rate, seed)
    t, x, y, p = s.timestamps.copy(), s.x_deg.copy(), s.y_deg.copy(), s.pupil_mm.copy()
    if blink is not None:
        off = (t >= blink[0]) & (t < blink[1])
        x[off] = y[off] = p[off] = np.nan
    return t, x, y, p


def keep_truth(name: str, t, x, y, p, original=None) -> None:
    if original is not None:  # what the file says is the simulated gaze up to its rounding
        for got, want in zip((x, y), original, strict=True):
            assert np.array_equal(np.isnan(got), np.isnan(want))
            assert np.nanmax(np.abs(got - want)) < 0.05, (name, np.nanmax(np.abs(got - want)))
    truth[f"{name}__t"], truth[f"{name}__x"], truth[f"{name}__y"] = t, x, y
    truth[f"{name}__pupil"] = p


def to_screen_px(x, y, screen_mm, distance_mm, res):
    """Degrees (x right, y up) -> screen pixels (origin top-left): the inverse of
    azimuth atan(dx/D), elevation atan(dy/sqrt(D^2+dx^2))."""
    dx = distance_mm * np.tan(np.radians(x))
    dy = np.hypot(distance_mm, dx) * np.tan(np.radians(y))
    u, v = dx / screen_mm[0] + 0.5, 0.5 - dy / screen_mm[1]
    return u * res[0], v * res[1]


def from_screen_px(px, py, screen_mm, distance_mm, res):
    dx = (px / res[0] - 0.5) * screen_mm[0]
    dy = (0.5 - py / res[1]) * screen_mm[1]
    return np.degrees(np.arctan2(dx, distance_mm)), np.degrees(
        np.arctan2(dy, np.hypot(distance_mm, dx))
    )


def cell(v: float, fmt: str, missing: str = "") -> str:
    return missing if not math.isfinite(v) else format(v, fmt)


# --------------------------------------------------------------------------- gazeguard CSV
def gazeguard_csv() -> None:
    lines = ["# gazeguard CSV: two people, interleaved rows are allowed",
             "t,x_deg,y_deg,pupil_mm,valid,person,task,Trigger"]  # fmt: skip
    for who, seed in (("p01", 11), ("p02", 12)):
        t, x, y, p = person(2.0, 250.0, seed, (1.0, 1.12))
        keep_truth(f"gazeguard_{who}", t, x, y, p)
        for i in range(len(t)):
            ok = math.isfinite(x[i])
            lines.append(
                f"{t[i]:.3f},{cell(x[i], '.17g')},{cell(y[i], '.17g')},{cell(p[i], '.17g')},"
                f"{int(ok)},{who},reading,{'' if i % 50 else 'go'}"
            )
    (HERE / "gazeguard.csv").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- Pupil Player
GAZE_COLS = (
    "gaze_timestamp,world_index,confidence,norm_pos_x,norm_pos_y,base_data,gaze_point_3d_x,"
    "gaze_point_3d_y,gaze_point_3d_z,eye_center0_3d_x,eye_center0_3d_y,eye_center0_3d_z,"
    "gaze_normal0_x,gaze_normal0_y,gaze_normal0_z,eye_center1_3d_x,eye_center1_3d_y,"
    "eye_center1_3d_z,gaze_normal1_x,gaze_normal1_y,gaze_normal1_z"
)
PUPIL_COLS = (
    "pupil_timestamp,world_index,eye_id,confidence,norm_pos_x,norm_pos_y,diameter,method,"
    "ellipse_center_x,ellipse_center_y,ellipse_axis_a,ellipse_axis_b,ellipse_angle,diameter_3d,"
    "model_confidence,model_id,sphere_center_x,sphere_center_y,sphere_center_z,sphere_radius,"
    "circle_3d_center_x,circle_3d_center_y,circle_3d_center_z,circle_3d_normal_x,"
    "circle_3d_normal_y,circle_3d_normal_z,circle_3d_radius,theta,phi,projected_sphere_center_x,"
    "projected_sphere_center_y,projected_sphere_axis_a,projected_sphere_axis_b,"
    "projected_sphere_angle"
)


def pupil_player(name: str, mapper_3d: bool) -> None:
    t, x, y, p = person(1.5, 200.0, 21 if mapper_3d else 22, (0.8, 0.95))
    t0 = 5831.204417  # Pupil time: seconds since an arbitrary epoch
    ts = t0 + t
    conf = np.where(np.isfinite(x), 0.97, 0.08)
    az, el = np.radians(np.nan_to_num(x)), np.radians(np.nan_to_num(y))
    fov = GEOMETRY["pupil_fov_deg"]
    nx = np.tan(az) / (2 * math.tan(math.radians(fov[0]) / 2)) + 0.5
    ny = np.tan(el) / (2 * math.tan(math.radians(fov[1]) / 2)) + 0.5  # origin bottom-left
    r = 600.0
    g3 = (r * np.cos(el) * np.sin(az), -r * np.sin(el), r * np.cos(el) * np.cos(az))
    gaze, pupils = [GAZE_COLS], [PUPIL_COLS]
    for i in range(len(t)):
        e0, e1 = float(ts[i]) - 0.0012, float(ts[i]) + 0.0012  # the two eye images' timestamps
        base = f"{e0!r}-0 {e1!r}-1"
        if mapper_3d:
            d = [g3[0][i], g3[1][i], g3[2][i], 31.2, 14.8, -21.0, *(c[i] / r for c in g3),
                 -29.5, 15.1, -20.4, *(c[i] / r for c in g3)]  # fmt: skip
            d3 = ",".join(f"{v:.6f}" for v in d)
        else:
            d3 = "," * 14
        gaze.append(
            f"{float(ts[i])!r},{i // 7},{conf[i]:.2f},{nx[i]:.17g},{ny[i]:.17g},{base},{d3}"
        )
        for eye, te, dd in ((0, e0, 0.07), (1, e1, -0.07)):
            ok = math.isfinite(p[i])
            c = 0.98 if ok else 0.0
            d3 = f"{p[i] + dd:.17g}" if ok else ""
            pupils.append(
                f"{te!r},{i // 7},{eye},{c},0.52,0.48,41.3,2d c++,99.1,95.3,40.2,42.4,12.0"
                + "," * 21
            )
            pupils.append(
                f"{te!r},{i // 7},{eye},{c},0.52,0.48,41.3,pye3d 0.3.0 real-time,99.1,95.3,40.2,"
                f"42.4,12.0,{d3},0.9,,1.2,-0.3,40.1,10.392304845413264,1.1,-0.2,29.4,0.01,"
                f"0.02,-0.99,{d3 and f'{(p[i] + dd) / 2:.17g}'},1.55,-1.6,98.2,96.0,131.2,"
                "131.2,0.0"
            )
    export = HERE / name / "exports" / "000"
    export.mkdir(parents=True, exist_ok=True)
    (export / "gaze_positions.csv").write_text("\r\n".join(gaze) + "\r\n")
    (export / "pupil_positions.csv").write_text("\r\n".join(pupils) + "\r\n")
    (export / "export_info.csv").write_text(
        "key,value\r\nPlayer Software Version,3.5.1\r\nData Format Version,2.3\r\n"
        "Export Date,17.05.2024\r\nExport Time,10:12:33\r\nFrame Index Range:,0 - 57\r\n"
        f"Relative Time Range,00:00.000 - 00:02.000\r\nAbsolute Time Range,{t0} - {t0 + 2}\r\n"
    )
    if mapper_3d:
        xt, yt = x, y
    else:
        xt, yt = np.degrees(np.arctan((nx - 0.5) * 2 * math.tan(math.radians(fov[0]) / 2))), \
            np.degrees(np.arctan((ny - 0.5) * 2 * math.tan(math.radians(fov[1]) / 2)))  # fmt: skip
        xt, yt = np.where(np.isfinite(x), xt, np.nan), np.where(np.isfinite(x), yt, np.nan)
    keep_truth(name, ts, xt, yt, p, (x, y))


# --------------------------------------------------------------------------- Tobii Pro Lab
TOBII_NEW = [
    "Recording timestamp [μs]", "Computer timestamp [μs]", "Sensor", "Participant name",
    "Recording name", "Recording date", "Recording resolution height",
    "Recording resolution width", "Eyetracker timestamp [μs]", "Event", "Event value",
    "Gaze point X [DACS px]", "Gaze point Y [DACS px]", "Gaze point left X [DACS px]",
    "Gaze point left Y [DACS px]", "Gaze point right X [DACS px]", "Gaze point right Y [DACS px]",
    "Pupil diameter left [mm]", "Pupil diameter right [mm]", "Validity left", "Validity right",
    "Eye position left Z [DACS mm]", "Eye position right Z [DACS mm]", "Gaze point X [MCS norm]",
    "Gaze point Y [MCS norm]", "Presented Stimulus name", "Eye movement type",
]  # fmt: skip


def tobii_new() -> None:
    g = GEOMETRY["tobii"]
    rows = ["\t".join(TOBII_NEW)]
    for who, rec, seed in (("P01", "Recording1", 31), ("P02", "Recording2", 32)):
        t, x, y, p = person(3.0, 120.0, seed, (1.5, 1.65))
        us = np.round(t * 1e6 + 2_364_417).astype(np.int64)  # starts a little after 0
        px, py = to_screen_px(x, y, g["screen_mm"], g["distance_mm"], g["resolution_px"])
        px, py = np.round(px), np.round(py)  # Pro Lab writes whole pixels
        xt, yt = from_screen_px(px, py, g["screen_mm"], g["distance_mm"], g["resolution_px"])
        keep_truth(f"tobii_{who}", us * 1e-6, xt, yt, np.round(p, 3), (x, y))
        common = [who, rec, "17.05.2024", "1080", "1920"]
        rows.append("\t".join([str(us[0]), "", "", *common, "", "RecordingStart", "",
                               *[""] * 16]))  # fmt: skip
        for i in range(len(t)):
            ok = math.isfinite(x[i])
            val = "Valid" if ok else "Invalid"
            gx, gy = cell(px[i], ".0f"), cell(py[i], ".0f")
            pl = cell(p[i] + 0.05, ".3f")
            pr = cell(p[i] - 0.05, ".3f")
            rows.append("\t".join([
                str(us[i]), str(us[i] + 1_700_000_000_000), "Eye Tracker", *common,
                str(us[i] + 90_000_000), "", "", gx, gy, gx, gy, gx, gy, pl, pr, val, val,
                "651.2" if ok else "", "648.9" if ok else "",
                cell(px[i] / 1920, ".4f"), cell(py[i] / 1080, ".4f"), "cats.jpg",
                "Fixation" if ok else "EyesNotFound",
            ]))  # fmt: skip
            if i == 100:  # an event at the same time as a sample, and a mouse row
                rows.append("\t".join([str(us[i]), "", "", *common, "", "ImageStimulusStart",
                                       "cats.jpg", *[""] * 16]))  # fmt: skip
                rows.append("\t".join([str(us[i] + 3), "", "Mouse", *common, "", "", "",
                                       *[""] * 16]))  # fmt: skip
    (HERE / "tobii_pro_lab.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8-sig")


def tobii_legacy() -> None:
    """Older Pro Lab: no units in the header, ms timestamps, a decimal comma (German locale)."""
    g = GEOMETRY["tobii"]
    head = ["Recording timestamp", "Participant name", "Recording name",
            "Recording resolution height", "Recording resolution width", "Event",
            "Gaze point X", "Gaze point Y", "Pupil diameter left", "Pupil diameter right",
            "Validity left", "Validity right"]  # fmt: skip
    t, x, y, p = person(3.0, 60.0, 33, (2.0, 2.2))
    ms = np.round(t * 1000 + 37).astype(np.int64)
    px, py = to_screen_px(x, y, g["screen_mm"], g["distance_mm"], g["resolution_px"])
    px, py = np.round(px), np.round(py)
    xt, yt = from_screen_px(px, py, g["screen_mm"], g["distance_mm"], g["resolution_px"])
    keep_truth("tobii_legacy", ms * 1e-3, xt, yt, np.round(p, 2), (x, y))
    rows = ["\t".join(head), "\t".join([str(ms[0]), "Anna", "Rec 3", "1080", "1920",
                                        "RecordingStart", *[""] * 6])]  # fmt: skip
    for i in range(len(t)):
        ok = math.isfinite(x[i])
        val = "Valid" if ok else "Invalid"
        rows.append("\t".join([
            str(ms[i]), "Anna", "Rec 3", "1080", "1920", "", cell(px[i], ".0f"),
            cell(py[i], ".0f"), cell(p[i], ".2f").replace(".", ","),
            cell(p[i], ".2f").replace(".", ","), val, val,
        ]))  # fmt: skip
    (HERE / "tobii_pro_lab_legacy.tsv").write_text("\r\n".join(rows) + "\r\n")


# --------------------------------------------------------------------------- EyeLink ASC
ASC_PREAMBLE = "\n".join(  # what edf2asc writes before the first recording block
    [
        "** CONVERTED FROM D:\\data\\{name}.edf using edfapi 4.2.1 Win32  Jun 21 2023 on "
        "Fri May 17 10:20:11 2024",
        "** DATE: Fri May 17 09:58:42 2024",
        "** TYPE: EDF_FILE BINARY EVENT SAMPLE TAGGED",
        "** VERSION: EYELINK II 1",
        "** SOURCE: EYELINK CL",
        "** EYELINK II CL v6.12 Feb  1 2018 (EyeLink Portable Duo)",
        "** CAMERA: EyeLink USBCAM Version 1.01",
        "** SERIAL NUMBER: CLU-DAB50",
        "** CAMERA_CONFIG: DAB50200.SCD",
        "** RECORDED BY experiment.py",
        "** SREB2.2.299 WIN32 LID:20A87A96 Mod:2024.05.17 09:58 CEST",
        "**",
        "",
        "MSG\t{t0m} DISPLAY_COORDS 0 0 1919 1079",
        "MSG\t{t0m} RETRACE_INTERVAL  16.6666666667",
        "MSG\t{t0c} !CAL",
        ">>>>>>> CALIBRATION (HV9,P-CR) FOR {eye_word}: <<<<<<<<<",
        "MSG\t{t0c} !CAL Calibration points:",
        "MSG\t{t0c} !CAL -25.3, -30.7         0,     73",
        "MSG\t{t0c} !CAL eye check box: (L,R,T,B)",
        "\t  -59     5   -46   -17",
        "",
        "MSG\t{t0c} !CAL Cal coeff:(X=a+bx+cy+dxx+eyy,Y=f+gx+goaly+ixx+jyy)",
        "   0.0002854  137.26  1.2339  0.40941  1.528",
        "   72.764 -6.3857  168.73  0.055881  1.5252",
        "",
        "MSG\t{t0c} !CAL VALIDATION HV9 {e} {eye_word}  GOOD ERROR 0.31 avg. 0.70 max  "
        "OFFSET 0.14 deg. 2.1,5.3 pix.",
        "MSG\t{t0v} TRIALID 1",
        "MSG\t{t0v} RECCFG CR {rate:.0f} 2 1 {eyes}",
        "MSG\t{t0v} GAZE_COORDS 0.00 0.00 1919.00 1079.00",
        "START\t{t0} \t{eye_words}\tSAMPLES\tEVENTS",
        "PRESCALER\t1",
        "VPRESCALER\t1",
        "PUPIL\t{pupil}",
        "EVENTS\tGAZE\t{eye_words}\tRATE\t{rate:.2f}\tTRACKING\tCR\tFILTER\t2",
        "SAMPLES\tGAZE\t{eye_words}\tRATE\t{rate:.2f}\tTRACKING\tCR\tFILTER\t2{extra}",
        "",
    ]
)


def eyelink(name: str, binocular: bool, pupil_kind: str, res: bool) -> None:
    g = GEOMETRY["eyelink"]
    rate = 1000.0 if binocular else 500.0
    t, x, y, p = person(1.2 if binocular else 2.0, rate, 41 if binocular else 42, (0.7, 0.82))
    t0 = 2_017_546
    tm = t0 + np.round(t * 1000, 1)
    scale = GEOMETRY["eyelink_pupil_scale"]
    eyes = ("L", "R") if binocular else ("L",)
    ppd = tuple(  # RES columns, pixels per degree, as written (2 decimals)
        np.array([float(f"{v:.2f}") for v in a])
        for a in (38.0 + 0.002 * np.arange(len(t)), 37.5 - 0.001 * np.arange(len(t)))
    )
    cx, cy = 960.0, 540.0
    per_eye = {}
    for k, e in enumerate(eyes):
        ex = x + (0.2 if k == 0 else -0.2) * binocular  # vergence: the eyes' mean is the truth
        if res:
            px, py = cx + ex * ppd[0], cy - y * ppd[1]
        else:
            px, py = to_screen_px(ex, y, g["screen_mm"], g["distance_mm"], g["resolution_px"])
        pu = (p / scale) ** 2 if pupil_kind == "AREA" else p / scale
        digits = 0 if pupil_kind == "AREA" else 1
        per_eye[e] = (np.round(px, 1), np.round(py, 1), np.round(pu, digits))
    # what a reader gets back from the written values
    if res:
        xs = [(per_eye[e][0] - cx) / ppd[0] for e in eyes]
        ys = [(cy - per_eye[e][1]) / ppd[1] for e in eyes]
    else:
        conv = [from_screen_px(per_eye[e][0], per_eye[e][1], g["screen_mm"], g["distance_mm"],
                               g["resolution_px"]) for e in eyes]  # fmt: skip
        xs, ys = [c[0] for c in conv], [c[1] for c in conv]
    pm = [np.sqrt(per_eye[e][2]) * scale if pupil_kind == "AREA" else per_eye[e][2] * scale
          for e in eyes]  # fmt: skip
    mean = [np.mean(v, axis=0) for v in (xs, ys, pm)]
    keep_truth(name, tm * 1e-3, *mean, (x, y))
    eye_words = "\t".join("LEFT" if e == "L" else "RIGHT" for e in eyes)
    extra = ("\tVEL\tRES" if res else "") + "\tINPUT"
    out = [ASC_PREAMBLE.format(
        name=name, t0m=t0 - 9000, t0c=t0 - 5000, t0v=t0 - 40, t0=t0, rate=rate, pupil=pupil_kind,
        eye_word="LEFT" if not binocular else "LR", e="L" if not binocular else "LR",
        eyes="".join(eyes), eye_words=eye_words, extra=extra,
    ).rstrip("\n")]  # fmt: skip
    out.append(f"MSG\t{t0} !MODE RECORD CR {rate:.0f} 2 1 {''.join(eyes)}")
    out.append(f"INPUT\t{t0}\t127")
    ok = np.isfinite(x)
    fix_start = None
    blink_start = tm[0]
    for i in range(len(t)):
        ti = f"{tm[i]:.1f}" if rate > 1000 else f"{tm[i]:.0f}"
        if i and ok[i - 1] and not ok[i]:
            if fix_start is not None:
                end = tm[i - 1]
                out.append(f"EFIX {eyes[0]}   {fix_start}\t{end:.0f}\t{end - fix_start + 1:.0f}"
                           "\t  960.0\t  540.0\t   1200")  # fmt: skip
                fix_start = None
            out.extend(f"SBLINK {e} {ti}" for e in eyes)
        if i and not ok[i - 1] and ok[i]:
            out.extend(
                f"EBLINK {e} {blink_start:.0f}\t{tm[i - 1]:.0f}\t{tm[i - 1] - blink_start + 1:.0f}"
                for e in eyes
            )
        if not ok[i] and (i == 0 or ok[i - 1]):
            blink_start = tm[i]
        if ok[i] and fix_start is None and i % 400 == 0:
            fix_start = int(tm[i])
            out.append(f"SFIX {eyes[0]}   {fix_start}")
        parts = [ti]
        for e in eyes:
            if ok[i]:
                px, py, pu = (v[i] for v in per_eye[e])
                parts += [f"{px:7.1f}", f"{py:7.1f}", f"{pu:7.1f}"]
            else:
                parts += ["   .", "   .", "    0.0"]
        if res:
            parts += ["   .   ." if not ok[i] else f"{0.0:7.1f}\t{0.0:7.1f}"] * len(eyes)
            parts += [f"{ppd[0][i]:7.2f}", f"{ppd[1][i]:7.2f}"]
        parts.append("  127.0")
        parts.append("....." if binocular else "...")
        out.append("\t".join(parts))
    out.append(f"MSG\t{tm[-1]:.0f} TRIAL_RESULT 0")
    out.append(f"END\t{tm[-1] + 1:.0f} \tSAMPLES\tEVENTS\tRES\t  38.10\t  37.40")
    (HERE / f"{name}.asc").write_text("\n".join(out) + "\n")


def main() -> None:
    gazeguard_csv()
    pupil_player("pupil_core_3d", mapper_3d=True)
    pupil_player("pupil_core_2d", mapper_3d=False)
    tobii_new()
    tobii_legacy()
    eyelink("eyelink_mono_area", binocular=False, pupil_kind="AREA", res=False)
    eyelink("eyelink_bino_diameter_res", binocular=True, pupil_kind="DIAMETER", res=True)
    np.savez_compressed(HERE / "truth.npz", **truth)
    (HERE / "geometry.json").write_text(json.dumps(GEOMETRY, indent=2) + "\n")
    print(f"wrote {len(truth) // 4} example recordings to {HERE}")


if __name__ == "__main__":
    main()
