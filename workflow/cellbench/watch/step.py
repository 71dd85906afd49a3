"""One bisect step: the good reference and a candidate served side by side from their pinned
digests, the regressed points measured with their repeats interleaved (good, candidate; then
candidate, good; ...) so the machine's drift falls on both, and the rows the verdict compares.

The servers are the pipeline's own launcher (``cellbench.serve.server``: ``vllm serve`` in the
image, the cell's model, serve args and environment, no tuned configs: a bisect looks for the
image that changed, so both sides run the image's defaults) and the load generator is the
pipeline's (``cellbench.serve.loadgen``). A candidate that cannot be pulled, started or served
raises ``CandidateFailed``; the good reference failing is an error of the whole bisect.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cellbench.serve import loadgen, server
from cellbench.serve.random_prompts import load_tokenizer
from cellbench.serve.timed_server import free_port


class CandidateFailed(RuntimeError):
    """The candidate could not be pulled, started or served: the step is skipped."""


class ReferenceFailed(RuntimeError):
    """The good reference could not be served: no step can be compared."""


@dataclass
class StepSpec:
    """What every step serves and measures (from the config and the bisect's options)."""

    model: str
    served_model_name: str
    points: list[tuple[int, int, int]]  # (isl, osl, concurrency)
    repeats: int
    prompts: int
    warmups: int
    starts: int = 1  # rounds, each with a fresh server per side
    serve_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    dtype: str | None = None
    tp: int = 1
    ep: int = 1
    gpu_vendor: str = "none"
    gpus: int = 0
    ready_timeout_s: float = 600.0
    ignore_eos: bool = True
    hf_cache: Path | None = None
    # Replaces `vllm serve` in the image (stand-in images that carry no vLLM).
    command: list[str] | None = None
    extra_mounts: list[tuple[str, str]] = field(default_factory=list)

    def check(self) -> None:
        if self.repeats * self.starts < 2:
            raise ValueError(f"repeats x starts = {self.repeats * self.starts}: a verdict "
                             "needs at least 2 per side")  # fmt: skip
        if self.gpus and self.gpus < 2 * self.tp:
            raise ValueError(
                f"a step serves the good and the candidate image at once: it needs 2 x tp = "
                f"{2 * self.tp} GPUs, the config has gpus = {self.gpus}"
            )


@dataclass
class Side:
    name: str  # "good" or "candidate"
    image_ref: str  # repository@sha256:...
    log_path: Path
    version: dict[str, Any] = field(default_factory=dict)
    started_s: float = 0.0


def _spec(step: StepSpec, side: Side, index: int) -> server.ServerSpec:
    gpus = list(range(index * step.tp, (index + 1) * step.tp)) if step.gpus else []
    return server.ServerSpec(
        runtime="docker", model=step.model, port=free_port(), log_path=side.log_path,
        served_model_name=step.served_model_name,
        ready_timeout_s=step.ready_timeout_s, serve_args=list(step.serve_args),
        env=dict(step.env), dtype=step.dtype, image_ref=side.image_ref, tp=step.tp, ep=step.ep,
        gpu_vendor=step.gpu_vendor if gpus else "none", gpu_indices=gpus,
        hf_cache=step.hf_cache, command=step.command, extra_mounts=list(step.extra_mounts),
        labels={"cellbench.bisect": side.name},
    )  # fmt: skip


def _pull(client, ref: str, failed: type[Exception]) -> None:
    from cellbench.runtime import images

    try:
        images.ensure_pulled(client, ref, out=None)
    except images.ImageError as exc:
        raise failed(f"pull failed: {exc}") from None


def measure(step: StepSpec, good: Side, candidate: Side, client) -> pd.DataFrame:
    """Both sides' rows (``side``, ``start``, ``repeat``, ``seq``, ``isl``, ``osl``,
    ``max_concurrency`` and the load generator's metrics) over ``step.starts`` rounds, each
    with a fresh server per side. ``repeat`` numbers a side's repeats over all rounds and
    ``seq`` orders every measurement of the step, so the comparison can pair the sides by
    round and repeat. Raises ``CandidateFailed`` or ``ReferenceFailed``."""
    step.check()
    _pull(client, good.image_ref, ReferenceFailed)
    _pull(client, candidate.image_ref, CandidateFailed)
    rows: list[dict[str, Any]] = []
    for start in range(step.starts):
        rows += _round(step, good, candidate, start, len(rows))
    return pd.DataFrame(rows)


def _round(step: StepSpec, good: Side, candidate: Side, start: int, seq: int) -> list[dict]:
    """One round: both servers started, the points measured ``step.repeats`` times with the
    sides alternating, both stopped."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        running = {}
        for index, (side, failed) in enumerate(
            ((good, ReferenceFailed), (candidate, CandidateFailed))
        ):
            t0 = time.monotonic()
            try:
                running[side.name] = stack.enter_context(server.serve(_spec(step, side, index)))
            except (server.ServerError, ValueError) as exc:
                raise failed(f"{side.name} server did not serve: {exc}"[:2000]) from None
            side.started_s = time.monotonic() - t0
            side.version = server.observe_version(running[side.name].base_url)
        first = running["good"]
        tok = load_tokenizer(step.model, first.base_url, first.model_id)
        for r in range(step.repeats):
            repeat = start * step.repeats + r
            order = (good, candidate) if (start + r) % 2 == 0 else (candidate, good)
            for isl, osl, conc in step.points:
                for side in order:
                    run = running[side.name]
                    failed = ReferenceFailed if side is good else CandidateFailed
                    if not run.alive():
                        raise failed(f"{side.name} server stopped: {run.fail('during a step')}")
                    spec = loadgen.PointSpec(isl, osl, conc, step.prompts, step.warmups,
                                             seed=repeat)  # fmt: skip
                    point = loadgen.run_point(run.base_url, run.model_id, tok, spec,
                                              ignore_eos=step.ignore_eos)  # fmt: skip
                    if point.get("failed"):
                        raise failed(f"{side.name}: {point['failed']} requests failed at "
                                     f"{isl}-{osl} c{conc}: {point.get('errors')}")  # fmt: skip
                    rows.append({**point, "side": side.name, "start": start,
                                 "repeat": repeat, "seq": seq + len(rows)})  # fmt: skip
    return rows


def sides(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(good rows, candidate rows) of a step's frame."""
    return (
        frame[frame.side == "good"].reset_index(drop=True),
        frame[frame.side == "candidate"].reset_index(drop=True),
    )
