"""The serve stage's command line, a thin way to a job (``StageConfig.from_job``).

The rules pass the job whole: ``--job JSON`` (its tracked settings, as
``cellbench.config.jobargs.serve_job`` builds them) and ``--host JSON`` (this host's details:
lease folder, timeouts, input folders), both dicts of ``StageConfig`` fields, and ``--out-dir``.
By hand, or to override one field of a job, each field also has a flag (``--repeats 2``,
``--grid-json '[...]'``); a key given twice is refused. The flags convert text to the field's
value and nothing more: ``StageConfig.from_job`` is the one place a job is built and checked.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cellbench.gsm8k.evaluate import APIS
from cellbench.serve.job import ARMS, IMAGES, PAIR, SERVERS, StageConfig


def _json(flag: str):
    def parse(text: str) -> Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{flag}: not valid JSON ({e}): {text!r}") from None

    return parse


def _list(kind: type, flag: str):
    what = "integers" if kind is int else "numbers"

    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"{flag} must be comma-separated {what}, got {text!r}") from None

    return parse


# Flags whose text becomes another type (after parsing, so a bad value's message is ours).
_CONVERT = {
    "job": _json("--job"),
    "host": _json("--host"),
    "serve_args": _json("--serve-args-json"),
    "server_command": _json("--server-command-json"),
    "grid": _json("--grid-json"),
    "concurrency": _list(int, "--concurrency"),
    "request_rates": _list(float, "--request-rates"),
    "images": _json("--images-json"),
    "server_env": _json("--server-env-json"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cellbench.serve",
        description=__doc__.split("\n")[0],
        argument_default=argparse.SUPPRESS,  # only what is given joins the job
    )
    a = p.add_argument
    a("--job", help="the job: a JSON object of fields")
    a("--host", help="this host's fields, a JSON object (untracked)")
    a("--out-dir", dest="out_dir")
    a("--runtime", choices=["local", "docker"])
    a("--cell-id", dest="cell_id")
    a("--arm", choices=[*ARMS, PAIR, IMAGES])
    a("--model")
    a("--served-model-name", dest="served_model_name")
    a("--tp", type=int)
    a("--ep", type=int)
    a("--image-ref", dest="image_ref")
    a("--image-digest", dest="image_digest")
    a("--gpu-vendor", dest="gpu_vendor", choices=["amd", "nvidia", "none"])
    a("--gpus", type=int)
    a("--total-gpus", dest="total_gpus", type=int)
    a("--hf-cache", dest="hf_cache")
    a("--cache-dir", dest="cache_dir")
    a("--lease-dir", dest="lease_dir")
    a("--serve-args-json", dest="serve_args")
    a("--server", choices=list(SERVERS))
    a("--model-dtype", dest="model_dtype", help="the model's dtype in the config (fp16, ...)")
    a("--device", help="local runtime: the torch device the server runs on")
    a("--vllm-python", dest="vllm_python", help="--server vllm, local: Python with vLLM")
    a("--server-command-json", dest="server_command")
    a("--grid-json", dest="grid")
    a("--concurrency")
    a("--prompts-per-concurrency", dest="prompts_per_concurrency", type=int)
    a("--warmups-per-concurrency", dest="warmups_per_concurrency", type=int)
    a("--repeats", type=int, help="repeats of the grid per server start")
    a("--starts-min", dest="starts_min", type=int, help="fewest server starts per side")
    a("--starts-cap", dest="starts_cap", type=int, help="most server starts per side")
    a("--min-change-pct", dest="min_change_pct", type=float, help="the equivalence margin")
    a("--request-rate", dest="request_rate")
    a("--request-rates", dest="request_rates")
    a("--burstiness", help="gamma shape of arrival gaps (1 Poisson, inf constant)")
    a("--request-rate-prompts", dest="request_rate_prompts", type=int)
    a("--goodput", nargs="*", help="SLOs as vllm bench serve: ttft:MS tpot:MS e2el:MS")
    a("--metrics-interval", dest="metrics_interval_s", type=float)
    a("--telemetry-interval", dest="telemetry_interval_s", type=float)
    a("--seed", type=int)
    a("--ignore-eos", dest="ignore_eos", action=argparse.BooleanOptionalAction)
    a("--ready-timeout", dest="ready_timeout_s", type=float)
    a("--max-failed-share", dest="max_failed_share", type=float)
    a("--min-plausible-tpot-ms", dest="min_plausible_tpot_ms", type=float)
    a("--min-plausible-itl-ms", dest="min_plausible_itl_ms", type=float)
    a("--tuned-config-dir", dest="tuned_config_dir")
    a("--gsm8k", action=argparse.BooleanOptionalAction)
    a("--gsm8k-dataset", dest="gsm8k_dataset", help="hub id or a local .jsonl file")
    a("--gsm8k-api", dest="gsm8k_api", choices=APIS)
    a("--gsm8k-instances", dest="gsm8k_instances", type=int)
    a("--gsm8k-fewshot", dest="gsm8k_fewshot", type=int)
    a("--gsm8k-limit", dest="gsm8k_limit", type=int)
    a("--gsm8k-timeout", dest="gsm8k_timeout_s", type=float)
    a("--gsm8k-max-gen-toks", dest="gsm8k_max_gen_toks", type=int)
    a("--gsm8k-concurrency", dest="gsm8k_concurrency", type=int)
    a("--images-json", dest="images")
    a("--server-env-json", dest="server_env")
    return p


def parse_args(argv: list[str] | None = None) -> StageConfig:
    """Turn the command line into a checked ``StageConfig``: ``--job`` and ``--host`` merged
    with the flags given, each key once."""
    flags = vars(_parser().parse_args(argv))
    for name, convert in _CONVERT.items():
        if name in flags:
            flags[name] = convert(flags[name])
    job: dict[str, Any] = {}
    for part in (flags.pop("job", {}), flags.pop("host", {}), flags):
        if not isinstance(part, dict):
            raise ValueError(f"--job and --host must be JSON objects, got {part!r}")
        twice = sorted(set(job) & set(part))
        if twice:
            raise ValueError(f"given twice (job, host or a flag): {', '.join(twice)}")
        job.update(part)
    return StageConfig.from_job(job)
