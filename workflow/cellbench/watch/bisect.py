"""``cellbench bisect IMAGE --good REF --bad REF``: the first bad image between a good and a
bad one.

Candidates are the image's dated nightly tags between the two (``images.NAME.
nightly_tag_pattern``) or the refs of ``--refs-file``; each is pinned by digest. The plan comes
first (candidates, the most steps, GPU-hours); then step 1 confirms that the bad ref measures
worse than the good one, and each later step halves the range (``cellbench.watch.search``).
A step serves the good reference and the candidate side by side (``cellbench.watch.step``) at
the regressed cell's points and calls the candidate bad when the pipeline's verdict
(``cellbench.watch.verdict``) says worse for any compared metric. A candidate that cannot be
pulled, started or served is skipped.

State: ``{out}/{IMAGE}/state.json`` after every step, so an interrupted bisect resumes with the
same command; other arguments are refused while one is under way (``--abandon`` drops it).
Record: each step as ``{out}/{IMAGE}/{session}/step-NN.json``, then ``result.json`` and
``result.md`` (the evidence table); files are written atomically and never rewritten. The
pipeline's archive of runs is only read.

Exit status: 0 one image named; 1 no single image (the bad ref did not reproduce, or skipped
candidates leave a range); 2 bad input, refused before anything runs; 3 the good reference
could not be served; 130 interrupted (resume with the same command).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cellbench.common import atomicio
from cellbench.config import cost
from cellbench.config import loader as cbconfig
from cellbench.config.jobargs import model_source
from cellbench.runtime import images
from cellbench.watch import candidates as cands
from cellbench.watch import search, step, verdict
from cellbench.watch.report import evidence_markdown

DEFAULT_OUT = Path("results/bisect")
FOUND, NOT_FOUND, BAD_INPUT, REFERENCE_FAILED, INTERRUPTED = 0, 1, 2, 3, 130
CODE = Path(__file__).resolve().parents[2]  # workflow/: the package, for stand-in servers


class BisectError(ValueError):
    """Bad input: the message names the argument or key and what is expected."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cellbench bisect", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("image", help="an image name under the config's images")
    p.add_argument("--good", required=True, help="the last good ref (tag or repo@sha256:...)")
    p.add_argument("--bad", required=True, help="the first ref known to be bad")
    p.add_argument("--refs-file", type=Path, help="candidates, one ref a line, oldest first")
    p.add_argument("--configfile", default="config/local.yaml")
    p.add_argument("--cell", help="the regressed cell (IMAGE/MODEL/tpN-epM); default: the "
                   "image's only cell")  # fmt: skip
    p.add_argument(
        "--point",
        action="append",
        default=[],
        help="ISL-OSL or ISL-OSL:CONCURRENCY (repeatable); default: the grid",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        help=f"metric the verdict reads (repeatable; default: {', '.join(verdict.METRICS)})",
    )
    p.add_argument("--repeats", type=int, help="interleaved pairs per point and start "
                   "(default: serve.repeats; pairs x starts at least 2)")  # fmt: skip
    p.add_argument("--starts", type=int, help="rounds per step, each with fresh servers "
                   "(default: serve.starts.min where the config has it, else 1)")  # fmt: skip
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--plan", action="store_true", help="print the plan and stop")
    p.add_argument("--abandon", action="store_true", help="drop an unfinished bisect's state")
    p.add_argument(
        "--exhaustive",
        action="store_true",
        help="measure every candidate in turn (n - 1 steps), to check a bisect",
    )
    p.add_argument("--server-command", help="replace `vllm serve` in the images (stand-in "
                   "images without vLLM); {port} and {model} are filled in")  # fmt: skip
    return p


def _points(cfg: dict, given: list[str]) -> list[tuple[int, int, int]]:
    grid = [(int(g["isl"]), int(g["osl"])) for g in cfg["serve"]["grid"]]
    conc = [int(c) for c in cfg["serve"]["concurrency"]]
    every = [(i, o, c) for i, o in grid for c in conc]
    if not given:
        return every
    out = []
    for text in given:
        shape, _, c = text.partition(":")
        try:
            isl, osl = (int(x) for x in shape.split("-"))
            wanted = [(isl, osl, int(c))] if c else [(isl, osl, k) for k in conc]
        except ValueError:
            raise BisectError(
                f"--point {text!r}: expected ISL-OSL or ISL-OSL:CONCURRENCY"
            ) from None
        for p in wanted:
            if p not in every:
                grid = ", ".join(f"{i}-{o}:{c}" for i, o, c in every)
                raise BisectError(f"--point {text!r}: not a point of the config's grid ({grid})")
            out.append(p)
    return out


def _cell(cfg: dict, image: str, given: str | None) -> cbconfig.Cell:
    mine = [c for c in cbconfig.cells(cfg) if c.image == image]
    if given:
        match = [c for c in mine if c.cell_id == given]
        if not match:
            known = ", ".join(c.cell_id for c in mine)
            raise BisectError(f"--cell {given}: not a cell of image {image} (cells: {known})")
        return match[0]
    if len(mine) != 1:
        raise BisectError(f"image {image} has {len(mine)} cells; name one with --cell "
                          f"({', '.join(c.cell_id for c in mine)})")  # fmt: skip
    return mine[0]


def setup(args: argparse.Namespace) -> dict[str, Any]:
    """Every check that needs no measurement; the bisect's arguments as its state keeps them."""
    try:
        cfg = cbconfig.load(args.configfile)
    except cbconfig.ConfigError as exc:
        raise BisectError(str(exc)) from None
    if cfg["runtime"] != "docker":
        raise BisectError(f"{args.configfile} has runtime: {cfg['runtime']}; a bisect pins "
                          "images, so it needs a docker config")  # fmt: skip
    if args.image not in cfg["images"]:
        known = ", ".join(sorted(cfg["images"]))
        raise BisectError(f"image {args.image!r} is not defined under images (known: {known})")
    spec = cfg["images"][args.image]
    repository = images.ImageRef.parse(spec["ref"]).repository
    cell = _cell(cfg, args.image, args.cell)
    metrics = args.metric or list(verdict.METRICS)
    for m in metrics:
        if m not in verdict.METRICS:
            raise BisectError(f"--metric {m}: expected one of {', '.join(verdict.METRICS)}")
    repeats = args.repeats or int(cfg["serve"]["repeats"])
    starts = args.starts or int((cfg["serve"].get("starts") or {}).get("min", 1))
    if starts < 1 or repeats * starts < 2:
        raise BisectError(f"--repeats {repeats} x --starts {starts}: a verdict needs at least "
                          "2 pairs and 1 start")  # fmt: skip
    if args.refs_file:
        refs = [cands.expand(repository, r) for r in cands.refs_file(args.refs_file)]
    else:
        pattern = spec.get("nightly_tag_pattern")
        if not pattern:
            raise BisectError(f"images.{args.image} has no nightly_tag_pattern; set one (e.g. "
                              "'nightly-(?P<date>[0-9]{8})') or give --refs-file")  # fmt: skip
        tags = cands.nightly_tags(cands.registry_tags(repository), pattern)
        refs = [f"{repository}:{t}" for t in tags]
    window = cands.window(refs, cands.expand(repository, args.good),
                          cands.expand(repository, args.bad))  # fmt: skip
    return {
        "configfile": args.configfile, "image": args.image, "cell": cell.cell_id,
        "points": [list(p) for p in _points(cfg, args.point)], "metrics": metrics,
        "repeats": repeats, "refs": window, "server_command": args.server_command,
        "exhaustive": args.exhaustive, "starts": starts,
        "min_change_pct": float(cfg["report"]["min_change_pct"]),
        "label": cbconfig.archive_label(cfg, args.image),
    }  # fmt: skip


def fingerprint(setting: dict) -> str:
    blob = json.dumps(setting, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_state(path: Path, setting: dict, abandon: bool) -> dict | None:
    """The unfinished bisect of these very arguments, to resume; None to start afresh.
    Refuses an unfinished one with other arguments, naming how they differ."""
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    if state.get("done") or abandon:
        return None
    if state["fingerprint"] != fingerprint(setting):
        was = state["setting"]
        differ = [k for k in sorted(set(was) | set(setting)) if was.get(k) != setting.get(k)]
        raise BisectError(
            f"an unfinished bisect of {setting['image']} with other arguments is in {path} "
            f"(they differ in: {', '.join(differ)}; it had --good {was['refs'][0]} --bad "
            f"{was['refs'][-1]}); resume it with its own arguments, or drop it with --abandon"
        )
    return state


def step_spec(cfg: dict, setting: dict, cell: cbconfig.Cell) -> step.StepSpec:
    model = cfg["models"][cell.model]
    spec = step.StepSpec(
        model=model_source(cfg, cell.model), served_model_name=cell.model,
        points=[tuple(p) for p in setting["points"]],
        repeats=setting["repeats"], prompts=int(cfg["serve"]["prompts_per_concurrency"]),
        starts=int(setting.get("starts", 1)),
        warmups=int(cfg["serve"].get("warmups_per_concurrency") or 0),
        serve_args=list(model.get("serve_args") or []),
        env=cbconfig.cell_env(cfg, cell.image, cell.model, cell.tp, cell.ep),
        dtype=model.get("dtype"), tp=cell.tp, ep=cell.ep, gpu_vendor=cfg["gpu_vendor"],
        gpus=int(cfg["gpus"]), ready_timeout_s=float(cfg["serve"]["ready_timeout_s"]),
        ignore_eos=bool(cfg["serve"].get("ignore_eos", True)),
        hf_cache=None if model.get("build") else Path(cfg["hf_cache"]).expanduser(),
    )  # fmt: skip
    if model.get("build") and not Path(spec.model).is_dir():
        raise BisectError(f"model {cell.model} is built by the workflow and {spec.model} is "
                          f"not there yet: snakemake {spec.model} --cores 2 first")  # fmt: skip
    if spec.hf_cache is not None:
        spec.hf_cache.mkdir(parents=True, exist_ok=True)  # a bind mount's source must exist
    if setting["server_command"]:
        spec.command = shlex.split(setting["server_command"])
        spec.extra_mounts = [(str(CODE), "/cellbench/code")]
        spec.env["PYTHONPATH"] = "/cellbench/code"
    return spec


def plan(cfg: dict, setting: dict, cell: cbconfig.Cell) -> dict:
    """The most steps and what they cost: each step serves two images (2 x tp GPUs) for the
    points and repeats chosen, scaled from `cellbench plan`'s serve estimate of the cell."""
    n = len(setting["refs"])
    steps = n - 1 if setting["exhaustive"] else search.max_steps(n)
    serve = cost.estimate_cell(cfg, cell, Path("results"))["serve"]
    every = len(cfg["serve"]["grid"]) * len(cfg["serve"]["concurrency"])
    # the plan's serve estimate prices serve.repeats in every round up to the starts cap
    cap = int(cfg["serve"]["repeats"]) * int(cfg["serve"]["starts"]["cap"])
    share = len(setting["points"]) / every * setting["repeats"] * setting["starts"] / cap
    step_s = serve["seconds"] * share
    gpus = 2 * cell.tp if int(cfg["gpus"]) else 0
    return {
        "candidates": n, "max_steps": steps, "step_s": step_s, "gpus_per_step": gpus,
        "gpu_hours": steps * step_s * gpus / 3600,
        "basis": f"{share:.2f} x the cell's serve estimate ({serve['basis']})",
    }  # fmt: skip


def print_plan(setting: dict, p: dict, resumed: dict | None) -> None:
    print(
        f"bisect {setting['image']} on {setting['cell']}: {p['candidates']} refs from "
        f"{setting['refs'][0]} (good) to {setting['refs'][-1]} (bad)"
    )
    print(
        f"  points {', '.join(f'{i}-{o}:{c}' for i, o, c in setting['points'])}; metrics "
        f"{', '.join(setting['metrics'])}; {setting['repeats']} interleaved pairs per point "
        f"in each of {setting['starts']} round(s) of fresh servers"
    )
    how = (
        "every candidate in turn"
        if setting["exhaustive"]
        else f"ceil(log2({p['candidates'] - 1})) + 1; one more per skipped candidate"
    )
    print(f"  at most {p['max_steps']} steps ({how}), ~{p['step_s']:.0f} s each on "
          f"{p['gpus_per_step']} GPUs: {p['gpu_hours']:.2f} GPU-hours at most")  # fmt: skip
    print(f"  estimate: {p['basis']}")
    if resumed:
        print(f"  resuming: {len(resumed['steps'])} step(s) already measured")
    for i, ref in enumerate(setting["refs"]):
        print(f"  [{i}] {ref}")


def _new_state(setting: dict, digests: list[str]) -> dict:
    now = datetime.now(UTC)
    return {
        "kind": "bisect_state", "setting": setting, "fingerprint": fingerprint(setting),
        "digests": digests, "session": now.strftime("%Y%m%dT%H%M%SZ"),
        "started": now.isoformat(timespec="seconds"), "outcomes": {}, "steps": [],
        "done": False,
    }  # fmt: skip


def run_step(state: dict, index: int, spec: step.StepSpec, client, folder: Path) -> dict:
    setting = state["setting"]
    refs, digests = setting["refs"], state["digests"]
    pinned = [images.ImageRef.parse(r).with_digest(d) for r, d in zip(refs, digests, strict=True)]
    n = len(state["steps"]) + 1
    logs = folder / f"step-{n:02d}"
    good = step.Side("good", pinned[0], logs / "good.log")
    cand = step.Side("candidate", pinned[index], logs / "candidate.log")
    print(f"step {n}: [{index}] {refs[index]} ({digests[index][:19]}) against the good ref",
          flush=True)  # fmt: skip
    t0 = time.monotonic()
    record: dict[str, Any] = {"step": n, "index": index, "ref": refs[index],
                              "digest": digests[index]}  # fmt: skip
    try:
        frame = step.measure(spec, good, cand, client)
    except step.CandidateFailed as exc:
        record.update(outcome=search.SKIP, reason=str(exc)[:1500], verdicts=[])
    else:
        g, c = step.sides(frame)
        rows = verdict.compare(g, c, min_change_pct=setting["min_change_pct"],
                               metrics=setting["metrics"])  # fmt: skip
        bad = verdict.worse(rows)
        record.update(
            outcome=search.BAD if bad else search.GOOD, verdicts=rows,
            reason=("worse: " + ", ".join(f"{r['point']} {r['metric']}" for r in bad))
            if bad else "no compared metric worse",
            measured=json.loads(frame.drop(columns=["errors"], errors="ignore").to_json(
                orient="records")),
        )  # fmt: skip
    wall = time.monotonic() - t0
    record.update(
        vllm_version=cand.version.get("version"), good_vllm_version=good.version.get("version"),
        wall_s=round(wall, 1), gpu_hours=wall * spec.tp * 2 * (1 if spec.gpus else 0) / 3600,
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
    )  # fmt: skip
    atomicio.write_json(folder / f"step-{n:02d}.json", record)
    print(f"  -> {record['outcome']}: {record['reason'][:300]} ({wall:.0f} s)", flush=True)
    return record


def finish(state: dict, found: dict, folder: Path) -> int:
    setting = state["setting"]
    first = found["first_bad"]
    result = {
        "kind": "bisect_result", "setting": setting, "session": state["session"],
        "steps": len(state["steps"]), "exhaustive": setting["exhaustive"],
        "max_steps": len(setting["refs"]) - 1 if setting["exhaustive"]
        else search.max_steps(len(setting["refs"])),
        "answer": found,
        "first_bad": None if first is None else {
            "ref": setting["refs"][first], "digest": state["digests"][first],
            "vllm_version": next((s["vllm_version"] for s in state["steps"]
                                  if s["index"] == first), None),
        },
        "gpu_hours": sum(s["gpu_hours"] for s in state["steps"]),
        "wall_s": sum(s["wall_s"] for s in state["steps"]),
        "evidence": state["steps"],
    }  # fmt: skip
    atomicio.write_json(folder / "result.json", result)
    text = evidence_markdown(result)
    atomicio.write_text(folder / "result.md", text)
    print(text)
    return FOUND if first is not None else NOT_FOUND


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        setting = setup(args)
        cfg = cbconfig.load(args.configfile)
        cell = next(c for c in cbconfig.cells(cfg) if c.cell_id == setting["cell"])
        spec = step_spec(cfg, setting, cell)
        state_path = args.out / setting["image"] / "state.json"
        state = load_state(state_path, setting, args.abandon)
        p = plan(cfg, setting, cell)
        print_plan(setting, p, state)
        if args.plan:
            return 0
        client = images.docker_client()
        if state is None:
            digests = [c.digest for c in cands.resolve(client, setting["refs"])]
            state = _new_state(setting, digests)
    except (BisectError, cands.CandidateError, images.ImageError, ValueError) as exc:
        print(f"cellbench bisect: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    folder = args.out / setting["image"] / state["session"]
    kind = search.Walk if setting["exhaustive"] else search.Search
    found = kind(setting["refs"], {int(k): v for k, v in state["outcomes"].items()})
    try:
        while (index := found.next()) is not None:
            record = run_step(state, index, spec, client, folder)
            found.record(index, record["outcome"])
            state["steps"].append(record)
            state["outcomes"][str(index)] = record["outcome"]
            atomicio.write_json(state_path, state)
    except step.ReferenceFailed as exc:
        print(f"cellbench bisect: the good ref cannot be served: {exc}", file=sys.stderr)
        atomicio.write_json(state_path, state)
        return REFERENCE_FAILED
    except KeyboardInterrupt:
        atomicio.write_json(state_path, state)
        print(f"cellbench bisect: interrupted after {len(state['steps'])} step(s); the same "
              "command resumes it", file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    state["done"] = True
    code = finish(state, found.answer(), folder)
    atomicio.write_json(state_path, state)
    return code


if __name__ == "__main__":
    sys.exit(main())
