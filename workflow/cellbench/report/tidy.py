"""One tidy table of every measured number, for live results and archived runs alike.

One row per (run, image, digest, model, tp, ep, arm, config_source, isl, osl, concurrency,
repeat, metric, value), plus ``stage`` (tune, serve, gsm8k), ``cell`` and ``batch_size`` (the
tuner's M; empty elsewhere). Keys that do not apply to a stage are empty (NA): a GSM8K score has
no ISL or repeat, a tuner timing has no arm. Every file is read through
``cellbench.results.loaders``
(schema, invariants, checksum), never by hand.

Each serve percentile (median, p90, p99 of TTFT, TPOT, ITL, E2EL) carries ``requests``, the
requests behind it; a p90 or p99 whose requests fall short of MLPerf's early-stopping count
has an empty ``value`` and ``note`` says why (``cellbench.stats.percentile_counts``). Other
rows leave both empty.

``config_source`` is what the number was measured with: for serving and GSM8K, the fused-MoE
config the arm's server logged (bench.json ``moe_config.source``: tuned, default, shipped, ...);
for the tuner, ``tuned`` for the pick and the baseline's own source for the baseline timing.

    python -m cellbench.report.tidy PATH [--configfile FILE] [--out-dir DIR]
        PATH: a results folder (live) or an archived run folder (holding MANIFEST.json);
        FILE: for live results, the config whose cells must all be there (default
        config/local.yaml); an archived run's manifest lists its own
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pandas as pd

from cellbench.common import atomicio
from cellbench.contracts import result_file
from cellbench.contracts.result_file import Result, ResultError
from cellbench.results import loaders, whole_sets
from cellbench.stats import percentile_counts

COLUMNS = (
    "run",
    "stage",
    "cell",
    "image",
    "digest",
    "model",
    "tp",
    "ep",
    "arm",
    "config_source",
    "batch_size",
    "isl",
    "osl",
    "concurrency",
    "repeat",
    "metric",
    "value",
    "requests",
    "note",
)
INT_COLUMNS = ("tp", "ep", "batch_size", "isl", "osl", "concurrency", "repeat", "requests")
LIVE_RUN = "live"
# A grid point's keys and bookkeeping: not measurements.
POINT_KEYS = {
    "isl",
    "osl",
    "max_concurrency",
    "repeat",
    "seq",
    "num_prompts",
    "num_warmups",
    "seed",
    "request_rate",
    *percentile_counts.REQUESTS,  # the requests column of each percentile's row
}
GSM8K_METRICS = (
    "strict_match",
    "strict_match_stderr",
    "flexible_extract",
    "flexible_extract_stderr",
    "n_samples",
)
CELL_LAYOUT = re.compile(r"^tp\d+-ep\d+$")


def _cell_keys(cell: str) -> dict:
    image, model, layout = cell.split("/")
    tp, ep = layout.removeprefix("tp").split("-ep")
    return {"cell": cell, "image": image, "model": model, "tp": int(tp), "ep": int(ep)}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _tune_cell(result: Result) -> str:
    # A summary does not record its cell; its folder does ({cell}/tune/summary.json).
    return "/".join(result.path.parts[-5:-2])


def tune_metrics(entry: Mapping) -> list[tuple[str, str | None, float | None]]:
    """(metric, config_source, value) of one tuner entry: the pick's own timing, the
    side-by-side baseline and pick timings and their gain, and the roofline fraction."""
    out: list[tuple[str, str | None, float | None]] = [
        ("time_us", "tuned", _number(entry.get("time_us")))
    ]
    base = loaders.baseline_of(entry)
    if base is not None:
        out += [
            ("baseline_us", base.get("source"), _number(base.get("time_us"))),
            ("pick_us", "tuned", _number(base.get("tuned_time_us"))),
            ("improvement_pct", "tuned", _number(entry.get("improvement_pct"))),
        ]
    fraction = roofline_fraction(entry)
    if fraction is not None:
        out.append(("roofline_fraction", "tuned", fraction))
    return out


def roofline_fraction(entry: Mapping) -> float | None:
    """The pick's fraction of the roofline (fused kernel), where the tuner recorded one."""
    roof = entry.get("roofline") or {}
    fused = roof.get("fused") if isinstance(roof, Mapping) else None
    if isinstance(fused, Mapping) and _number(fused.get("roofline_fraction")) is not None:
        return float(fused["roofline_fraction"])
    return _number(entry.get("roofline_fraction"))


def _published(point: Mapping, metric: str, value: float) -> dict:
    """One serve number's row part: metric, value (NaN when a tail percentile is withheld),
    the requests behind a percentile and why it is withheld."""
    why = percentile_counts.withheld_reason(point, metric)
    return {
        "metric": metric,
        "value": math.nan if why else value,
        "requests": percentile_counts.count_of_field(point, metric),
        "note": why,
    }


def tidy_frame(
    loaded: Iterable[Result], run: str = LIVE_RUN, digests: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """Checked results as the tidy table. ``digests``: image -> digest, used for a cell whose
    serve results (which record the digest they ran) are absent (an archive's manifest)."""
    loaded = list(loaded)
    digests = dict(digests or {})
    # Per cell and arm, the digest and MoE config its server reported (serve results).
    seen_digest: dict[str, str] = {}
    source: dict[tuple[str, str], str | None] = {}
    for r in loaded:
        if r.kind == result_file.BENCH:
            d = r.data
            if d.get("image_digest"):
                seen_digest.setdefault(d["cell"], d["image_digest"])
            source[(d["cell"], d["arm"])] = (d.get("moe_config") or {}).get("source")

    def digest_of(cell: str) -> str | None:
        return seen_digest.get(cell) or digests.get(cell.split("/")[0])

    rows: list[dict] = []
    for r in loaded:
        if r.kind == result_file.BENCH:
            d = r.data
            keys = _cell_keys(d["cell"])
            base = {
                **keys,
                "run": run,
                "stage": "serve",
                "digest": d.get("image_digest") or digest_of(d["cell"]),
                "arm": d["arm"],
                "config_source": source.get((d["cell"], d["arm"])),
            }
            for point in d["points"]:
                where = {
                    "isl": point["isl"],
                    "osl": point["osl"],
                    "concurrency": point.get("max_concurrency"),
                    "repeat": point.get("repeat"),
                }
                for metric, value in point.items():
                    number = _number(value)
                    if metric in POINT_KEYS or number is None:
                        continue
                    rows.append({**base, **where, **_published(point, metric, number)})
        elif r.kind == result_file.GSM8K:
            d = r.data
            base = {
                **_cell_keys(d["cell"]),
                "run": run,
                "stage": "gsm8k",
                "digest": digest_of(d["cell"]),
                "arm": d["arm"],
                "config_source": source.get((d["cell"], d["arm"])),
            }
            for metric in GSM8K_METRICS:
                if _number(d.get(metric)) is not None:
                    rows.append({**base, "metric": metric, "value": float(d[metric])})
        elif r.kind == result_file.TUNE:
            cell = _tune_cell(r)
            base = {**_cell_keys(cell), "run": run, "stage": "tune", "digest": digest_of(cell)}
            for m, entry in r.data.get("entries", {}).items():
                for metric, config_source, value in tune_metrics(entry):
                    if value is None or math.isnan(value):
                        continue
                    rows.append(
                        {
                            **base,
                            "batch_size": int(m),
                            "config_source": config_source,
                            "metric": metric,
                            "value": value,
                        }
                    )
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in INT_COLUMNS:
        frame[col] = frame[col].astype("Int64")
    frame["value"] = frame["value"].astype(float)
    order = ["run", "cell", "stage", "arm", "batch_size", "isl", "osl", "concurrency", "repeat"]
    return frame.sort_values(order, kind="stable", na_position="first").reset_index(drop=True)


def cells_in(root: Path) -> list[str]:
    """The cells under a results folder or an archived run folder (image/model/tpN-epM
    folders holding any stage's folder: tune, serve or gsm8k); an archived run's manifest
    lists them."""
    manifest = _manifest(root)
    if manifest is not None:
        return list(manifest.get("cells", []))
    found = set()
    for stage in ("tune", "serve", "gsm8k"):
        for stage_dir in root.glob(f"*/*/*/{stage}"):
            cell_dir = stage_dir.parent
            # results/logs/IMAGE/MODEL/tpN-epM holds log files, never stage folders
            if CELL_LAYOUT.match(cell_dir.name) and stage_dir.is_dir():
                found.add(str(cell_dir.relative_to(root)))
    return sorted(found)


def _manifest(root: Path) -> dict | None:
    path = root / "MANIFEST.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise ResultError(path, "(file)", exc.strerror or str(exc), "a readable archive "
                          "manifest", "nothing: fix the file's permissions") from None  # fmt: skip
    except ValueError as exc:
        raise ResultError(path, "(file)", "(not JSON)", f"an archive manifest: {exc}",
                          "nothing: the archived run is damaged") from exc  # fmt: skip


def stage_files(root: Path, cells: Iterable[str], whole: bool = True) -> list[Path]:
    """The cells' stage results under ``root`` (tuning summary, serve and GSM8K results), all
    of them: ``IncompleteResults`` names any that is missing (a short table would read as a
    smaller experiment). ``whole=False``: those present (one cell's figures say what is
    absent in the figure itself)."""
    cells = list(cells)
    if not whole:
        every = [root / cell / rel for cell in cells for rel in whole_sets.CELL_STAGE_FILES]
        return [f for f in every if f.is_file()]
    manifest = _manifest(root)
    if manifest is None:
        rebuild = whole_sets.LIVE_REBUILD
    else:
        ref = f"{manifest.get('label', '?')}/{manifest.get('run', root.name)}"
        rebuild = f"nothing rebuilds an archived run; check it: cellbench archive verify {ref}"
    whole_sets.check_whole(root, cells, rebuild)
    return [root / cell / rel for cell in cells for rel in whole_sets.CELL_STAGE_FILES]


def tidy(
    path: str | Path, expected: Iterable[str] = (), source: str = "the config"
) -> pd.DataFrame:
    """The tidy table of a results folder (run ``live``) or of an archived run folder (run
    ``LABEL/RUN`` from its MANIFEST.json). Raises ``ResultError`` for a bad file or a cell
    missing and ``FileNotFoundError`` for a folder with no cell.

    An archived run's cells are its manifest's. A live folder's are those found in it and the
    ``expected`` cells (the config's, named by ``source``): a cell whose whole folder is gone
    would otherwise leave a smaller table that looks whole."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a folder (expected results/ or an archived run)")
    manifest = _manifest(root)
    cells = cells_in(root)
    if manifest is None:
        absent = sorted(set(expected) - set(cells))
        if absent:
            raise ResultError(
                root / absent[0],
                "(cell folder)",
                "(absent)",
                f"the results of every cell of {source} ({len(absent)} of {len(set(expected))} "
                f"have none under {root}: {', '.join(absent)})",
                whole_sets.LIVE_REBUILD,
            )
    if not cells:
        raise FileNotFoundError(
            f"{root}: no cell found (expected IMAGE/MODEL/tpN-epM/tune/summary.json under it, "
            "or an archived run's MANIFEST.json)"
        )
    run = LIVE_RUN
    digests: dict[str, str] = {}
    if manifest is not None:
        run = f"{manifest.get('label', '?')}/{manifest.get('run', root.name)}"
        digests = manifest.get("images", {})
    loaded = [loaders.load(f, root) for f in stage_files(root, cells)]
    return tidy_frame(loaded, run, digests)


TIDY_NAMES = ("tidy.parquet", "tidy.csv")


def write_tidy(frame: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """``tidy.parquet`` and ``tidy.csv`` in ``out_dir``, each written atomically."""
    out_dir = Path(out_dir)
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomicio.write_bytes(out_dir / "tidy.parquet", buffer.getvalue())
    atomicio.write_text(out_dir / "tidy.csv", frame.to_csv(index=False))
    return [out_dir / name for name in TIDY_NAMES]


def main(
    argv: list[str] | None = None, config_cells: Callable[[str | None], list[str]] | None = None
) -> int:
    """``cellbench tidy``. ``config_cells`` (the ``cellbench`` command's) gives a config
    file's cells, the default config's for None, or raises ValueError naming what is wrong;
    without it live results cannot be checked, and are refused."""
    parser = argparse.ArgumentParser(
        prog="cellbench tidy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", help="results/ or an archived run folder")
    parser.add_argument(
        "--configfile",
        help="live results: the config whose every cell must be there (default: the one the "
        "default profile reads, config/local.yaml); an archived run's manifest names its own",
    )
    parser.add_argument(
        "--out-dir", help="write tidy.parquet and tidy.csv here (default: print a summary)"
    )
    args = parser.parse_args(argv)
    root = Path(args.path)
    expected: list[str] = []
    if root.is_dir() and not (root / "MANIFEST.json").exists():  # live results
        if config_cells is None:
            print("cellbench tidy: error: live results are checked against a config's cells: "
                  "run it as `cellbench tidy`", file=sys.stderr)  # fmt: skip
            return 2
        try:
            expected = config_cells(args.configfile)
        except ValueError as exc:
            print(f"cellbench tidy: {exc}", file=sys.stderr)
            return 2
    try:
        frame = tidy(args.path, expected, f"--configfile {args.configfile or 'config/local.yaml'}")
    except (ResultError, FileNotFoundError) as exc:
        print(f"cellbench tidy: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # an unreadable folder: a user's fault, not a traceback
        print(f"cellbench tidy: error: cannot read {exc.filename or args.path}: "
              f"{exc.strerror or exc}", file=sys.stderr)  # fmt: skip
        return 1
    if args.out_dir:
        try:
            written = write_tidy(frame, args.out_dir)
        except OSError as exc:
            where = exc.filename or args.out_dir
            reason = exc.strerror or exc
            print(f"cellbench tidy: error: cannot write --out-dir {args.out_dir}: {reason} "
                  f"({where})", file=sys.stderr)  # fmt: skip
            return 1
        for path in written:
            print(f"written: {path}")
    else:
        print(frame.groupby(["run", "cell", "stage"]).size().to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
