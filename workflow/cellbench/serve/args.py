"""The serve stage's command line: the flags the serve and compare rules build from the config,
parsed into a ``StageConfig`` (``cellbench.serve.job``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cellbench.gsm8k.evaluate import (
    APIS,
    HUB_DATASET,
)
from cellbench.serve import (
    load_shapes,
    server_metrics,
    telemetry,
)
from cellbench.serve.job import ARMS, IMAGES, PAIR, SERVERS, ImageSpec, StageConfig, _env_arg


def _json_arg(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag}: not valid JSON ({e}): {text!r}") from None


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> StageConfig:
    """Turn the command line into a validated ``StageConfig``."""
    p = argparse.ArgumentParser(
        prog="python -m cellbench.serve", description=__doc__.split("\n")[0]
    )
    a = p.add_argument
    a("--runtime", required=True, choices=["local", "docker"])
    a("--cell-id", required=True)
    a("--arm", required=True, choices=[*ARMS, PAIR, IMAGES])
    a("--model", required=True)
    a("--served-model-name", default=None)
    a("--tp", type=int, default=1)
    a("--ep", type=int, default=1)
    a("--image-ref", default=None)
    a("--image-digest", default=None)
    a("--gpu-vendor", default="none", choices=["amd", "nvidia", "none"])
    a("--gpus", type=int, default=0)
    a("--total-gpus", type=int, default=0)
    a("--hf-cache", type=Path, default=None)
    a("--cache-dir", type=Path, default=None)
    a("--lease-dir", type=Path, default=Path("results/.leases"))
    a("--serve-args-json", default="[]")
    a("--server", choices=list(SERVERS), default=None)
    a("--model-dtype", default=None, help="the model's dtype in the config (fp16, bf16, ...)")
    a("--device", default="cpu", help="local runtime: the torch device the server runs on")
    a("--vllm-python", default=None, help="--server vllm, local runtime: Python with vLLM")
    a("--server-command-json", default=None)
    a("--grid-json", required=True)
    a("--concurrency", required=True)
    a("--prompts-per-concurrency", type=int, default=10)
    a("--warmups-per-concurrency", type=int, default=2)
    a("--repeats", type=int, default=1)
    a("--request-rate", default="inf")
    a("--request-rates", default="", help="request-rate points, req/s, comma-separated")
    a("--burstiness", default="1", help="gamma shape of arrival gaps (1 Poisson, inf constant)")
    a("--request-rate-prompts", type=int, default=32, help="measured requests per rate point")
    a("--goodput", nargs="*", default=[], help="SLOs as vllm bench serve: ttft:MS tpot:MS e2el:MS")
    a("--metrics-interval", type=float, default=server_metrics.DEFAULT_INTERVAL_S)
    a("--telemetry-interval", type=float, default=telemetry.DEFAULT_INTERVAL_S)
    a("--seed", type=int, default=0)
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    a("--ready-timeout", type=float, default=600.0)
    a("--max-failed-share", type=float, default=0.05)
    a("--tuned-config-dir", type=Path, default=None)
    a("--gsm8k", action=argparse.BooleanOptionalAction, default=True)
    a("--gsm8k-dataset", default=HUB_DATASET, help="hub id or a local .jsonl file")
    a("--gsm8k-api", choices=APIS, default="auto")
    a("--gsm8k-instances", type=int, default=1, help="server starts per arm that run GSM8K")
    a("--gsm8k-fewshot", type=int, default=5)
    a("--gsm8k-limit", type=int, default=None)
    a("--gsm8k-timeout", type=float, default=6 * 3600.0)
    a("--gsm8k-max-gen-toks", type=int, default=256)
    a("--gsm8k-concurrency", type=int, default=1, help="lm-eval's num_concurrent")
    a("--images-json", default=None)
    a("--server-env-json", default="{}", help="variables for every server of the job")
    a("--out-dir", required=True, type=Path)
    ns = p.parse_args(argv)
    serve_args = _json_arg(ns.serve_args_json, "--serve-args-json")
    if not isinstance(serve_args, list) or not all(isinstance(x, str) for x in serve_args):
        raise ValueError(f"--serve-args-json must be a JSON list of strings: {serve_args!r}")
    command = None
    if ns.server_command_json is not None:
        command = _json_arg(ns.server_command_json, "--server-command-json")
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(x, str) for x in command)
        ):
            raise ValueError(
                f"--server-command-json must be a non-empty list of strings: {command!r}"
            )
    images = None
    if ns.images_json is not None:
        raw = _json_arg(ns.images_json, "--images-json")
        if not isinstance(raw, list):
            raise ValueError(f"--images-json must be a JSON list of objects: {raw!r}")
        images = [ImageSpec.from_json(obj, f"--images-json[{i}]") for i, obj in enumerate(raw)]
    try:
        rate = float(ns.request_rate)
    except ValueError:
        raise ValueError(
            f"--request-rate must be a number or inf, got {ns.request_rate!r}"
        ) from None
    try:
        request_rates = [float(x) for x in ns.request_rates.split(",") if x.strip()]
        burstiness = float(ns.burstiness)
    except ValueError:
        raise ValueError(
            f"--request-rates must be comma-separated numbers and --burstiness a number or "
            f"inf, got {ns.request_rates!r} and {ns.burstiness!r}"
        ) from None
    cfg = StageConfig(
        runtime=ns.runtime,
        cell_id=ns.cell_id,
        arm=ns.arm,
        model=ns.model,
        out_dir=ns.out_dir,
        grid=_json_arg(ns.grid_json, "--grid-json"),
        concurrency=_int_list(ns.concurrency, "--concurrency"),
        served_model_name=ns.served_model_name,
        tp=ns.tp,
        ep=ns.ep,
        image_ref=ns.image_ref,
        image_digest=ns.image_digest,
        gpu_vendor=ns.gpu_vendor,
        gpus=ns.gpus,
        total_gpus=ns.total_gpus,
        hf_cache=ns.hf_cache,
        cache_dir=ns.cache_dir,
        lease_dir=ns.lease_dir,
        serve_args=serve_args,
        server=ns.server or ("transformers" if ns.runtime == "local" else "vllm"),
        model_dtype=ns.model_dtype,
        device=ns.device,
        vllm_python=ns.vllm_python,
        server_command=command,
        prompts_per_concurrency=ns.prompts_per_concurrency,
        warmups_per_concurrency=ns.warmups_per_concurrency,
        repeats=ns.repeats,
        request_rate=rate,
        request_rates=request_rates,
        burstiness=burstiness,
        request_rate_prompts=ns.request_rate_prompts,
        goodput=load_shapes.parse_goodput(ns.goodput, "--goodput"),
        metrics_interval_s=ns.metrics_interval,
        telemetry_interval_s=ns.telemetry_interval,
        seed=ns.seed,
        ignore_eos=ns.ignore_eos,
        ready_timeout_s=ns.ready_timeout,
        max_failed_share=ns.max_failed_share,
        tuned_config_dir=ns.tuned_config_dir,
        gsm8k=ns.gsm8k,
        gsm8k_dataset=ns.gsm8k_dataset,
        gsm8k_api=ns.gsm8k_api,
        gsm8k_instances=ns.gsm8k_instances,
        gsm8k_fewshot=ns.gsm8k_fewshot,
        gsm8k_limit=ns.gsm8k_limit,
        gsm8k_timeout_s=ns.gsm8k_timeout,
        gsm8k_max_gen_toks=ns.gsm8k_max_gen_toks,
        gsm8k_concurrency=ns.gsm8k_concurrency,
        images=images,
        server_env=_env_arg(
            _json_arg(ns.server_env_json, "--server-env-json"), "--server-env-json"
        ),
    )
    cfg.validate()
    return cfg
