"""The bad-input catalogue's second part: the config rules issues 30 and 33 added (names that
collide with the results layout, integers written as floats, reserved server options, secret-
looking names, shapes, ISL + OSL beyond the context, one-of keys)."""

from pathlib import Path

from support.bad_input_probes import (  # noqa: F401
    DELETE,
    MOE,
    ODD,
    Q30,
    SMALL,
    Probe,
    _base,
    _rename_image,
    _set,
    _with_model_config,
)

ROOT = Path(__file__).resolve().parents[2]

PROBES: list[Probe] = [
    # --- issue 30: names that collide with the results layout ---
    *[
        Probe(
            f"image-named-{name}",
            "config",
            f"an image named `{name}` (results/{name}/ is the pipeline's own folder)",
            f"images.{name}: results/{name}/ is one of the pipeline's own folders",
            base="local",
            edit=_rename_image(name),
        )
        for name in ("report", "archive", "logs", "configs", "gates", "Compare")
    ],
    # --- issue 30: integer settings written as floats (JSON Schema alone calls 3.0 an int) ---
    *[
        Probe(
            f"float-{key.replace('.', '-').replace('[', '').replace(']', '')}",
            "config",
            f"`{key}: {shown}`",
            f"{key} = {shown}: must be an integer, written without a decimal point ({whole})",
            base=base,
            edit=edit,
        )
        for key, shown, whole, base, edit in (
            ("serve.repeats", "3.0", "3", "config", _set("serve", "repeats", 3.0)),
            ("cells[0].tp", "2.0", "2", "config", _set("cells", 0, "tp", 2.0)),
            ("gpus", "8.0", "8", "config", _set("gpus", 8.0)),
            ("tune.batch_sizes[1]", "16.0", "16", "local", _set("tune", "batch_sizes", [1, 16.0])),
            ("serve.concurrency[0]", "16.0", "16", "config", _set("serve", "concurrency", [16.0])),
            ("gsm8k.num_fewshot", "5.0", "5", "config", _set("gsm8k", "num_fewshot", 5.0)),
            ("gsm8k.limit", "10.0", "10", "local", _set("gsm8k", "limit", 10.0)),
            ("tune.max_configs", "6.0", "6", "local", _set("tune", "max_configs", 6.0)),
            (
                "serve.grid[0].isl",
                "512.0",
                "512",
                "config",
                lambda c: c["serve"]["grid"][0].update(isl=512.0),
            ),
            (
                "serve.prompts_per_concurrency",
                "10.0",
                "10",
                "config",
                _set("serve", "prompts_per_concurrency", 10.0),
            ),
        )
    ],
    # --- issue 30: reserved server options in the spellings vLLM's parser also takes ---
    *[
        Probe(
            f"serve-args-{i}",
            "config",
            f"`serve_args: {args}`",
            f"models.{Q30}.serve_args holds {shown!r} (as {option}): the pipeline sets it",
            edit=_set("models", Q30, "serve_args", args),
        )
        for i, (args, shown, option) in enumerate(
            (
                (
                    ["--tensor_parallel_size", "4"],
                    "--tensor_parallel_size",
                    "--tensor-parallel-size",
                ),
                (
                    ["--tensor_parallel_size=4"],
                    "--tensor_parallel_size=4",
                    "--tensor-parallel-size",
                ),
                (
                    ["--enable_expert_parallel"],
                    "--enable_expert_parallel",
                    "--enable-expert-parallel",
                ),
                (
                    ["--no-enable-expert-parallel"],
                    "--no-enable-expert-parallel",
                    "--no-enable-expert-parallel",
                ),
                (["--served_model_name", "x"], "--served_model_name", "--served-model-name"),
                (["--port=8001"], "--port=8001", "--port"),
                (["-tp=4"], "-tp=4", "-tp"),
                (["-tp4"], "-tp4", "-tp"),
                (["--tensor-parallel", "4"], "--tensor-parallel", "--tensor-parallel-size"),
                (["--model=other/model"], "--model=other/model", "--model"),
            )
        )
    ],
    # --- issue 30: secret-looking variable names beyond *_TOKEN / *_KEY ---
    *[
        Probe(
            f"env-secret-{name.lower().replace('_', '-')}",
            "config",
            f'`cells[0].env: {{{name}: "..."}}`',
            f"cells[0].env.{name}: looks like a secret, refused in favour of the pass-through list",
            edit=_set("cells", 0, "env", {name: "x"}),
        )
        for name in (
            "GITHUB_PAT",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AZURE_CLIENT_SECRET",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "DB_PASS",
            "WANDB_API_KEY",
            "NPM_AUTHTOKEN",
            "DOCKER_AUTH_CONFIG",
            "PIP_PASSPHRASE",
            "ssh_private_key_file",
        )
    ],
    # --- issue 30: shapes `cellbench shapes` refuses, now refused by the config ---
    Probe(
        "shape-ep-experts",
        "config",
        "60 experts (`model_config`) with `tp: 8, ep: true` (EP size does not divide them)",
        f"cells[0]: model {Q30!r} at tp = 8, ep = true: num_experts=60 is not divisible by the "
        "expert-parallel size 8",
        edit=lambda c: (_with_model_config(Q30, ODD, tp=8)(c), c.update(gpus=16)),
    ),
    Probe(
        "shape-block-n",
        "config",
        "block `[128, 128]` with per-rank N 125 (`tp: 8`, no EP)",
        f"cells[0]: model {Q30!r} at tp = 8: block_shape n=128 does not divide per-rank N=125",
        edit=lambda c: (_with_model_config(Q30, ODD, tp=8, ep=False)(c), c.update(gpus=16)),
    ),
    Probe(
        "shape-n-over-tp",
        "config",
        "intermediate size 1000 with `tp: 16`",
        f"cells[0]: model {Q30!r} at tp = 16: moe_intermediate_size=1000 is not divisible by tp=16",
        edit=lambda c: (_with_model_config(Q30, ODD, tp=16, ep=False)(c), c.update(gpus=32)),
    ),
    Probe(
        "shape-block-k",
        "config",
        "block `[128, 96]` on Qwen3-30B-A3B (K 2048 is not a multiple of 96)",
        f"cells[0]: model {Q30!r} at tp = 2, ep = true: block_shape k=96 does not divide "
        "hidden_size K=2048",
        edit=lambda c: (
            _with_model_config(Q30, f"{MOE}/qwen3-30b-a3b-fp8.json")(c),
            c["models"][Q30].update(block_shape=[128, 96]),
        ),
    ),
    Probe(
        "model-config-folder-without-json",
        "config",
        "`model_config:` a folder without config.json",
        f"models.{Q30}.model_config = '{MOE}': a folder without config.json",
        edit=_set("models", Q30, "model_config", MOE),
    ),
    Probe(
        "model-config-not-json-config",
        "config",
        "`model_config:` a file that is not JSON (pyproject.toml)",
        f"models.{Q30}.model_config = '{ROOT}/pyproject.toml': model config {ROOT}/pyproject.toml"
        " is not valid JSON",
        edit=_set("models", Q30, "model_config", str(ROOT / "pyproject.toml")),
    ),
    Probe(
        "model-config-dense",
        "config",
        "`model_config:` a dense model's config.json",
        f"cells[0]: model {Q30!r} at tp = 2, ep = true: model config has no expert-count field",
        edit=_set("models", Q30, "model_config", f"{MOE}/qwen3-dense.json"),
    ),
    # --- issue 30: ISL + OSL beyond the model's context ---
    Probe(
        "context-built-model",
        "config",
        "`serve.grid: [{isl: 4000, osl: 200}]` for the built tiny models (context 4096)",
        "serve.grid[0] = {isl: 4000, osl: 200}: isl + osl = 4200 exceeds model "
        "'tiny-qwen3-moe''s context of 4096 tokens (max_position_embeddings = 4096 in "
        "models.tiny-qwen3-moe.build 'tiny-qwen3-moe'); expected isl + osl <= 4096",
        base="local",
        edit=_set("serve", "grid", [{"isl": 4000, "osl": 200}]),
    ),
    Probe(
        "context-max-model-len",
        "config",
        "`serve_args: [--max-model-len, '8192']` with the default grid (8192 + 1024)",
        "serve.grid[4] = {isl: 8192, osl: 1024}: isl + osl = 9216 exceeds model "
        f"'{Q30}''s context of 8192 tokens (models.{Q30}.serve_args --max-model-len 8192)",
        edit=_set("models", Q30, "serve_args", ["--max-model-len", "8192"]),
    ),
    Probe(
        "context-max-model-len-underscore",
        "config",
        "`serve_args: [--max_model_len=4096]` with the default grid",
        "serve.grid[3] = {isl: 4096, osl: 4096}: isl + osl = 8192 exceeds model",
        edit=_set("models", Q30, "serve_args", ["--max_model_len=4096"]),
    ),
    Probe(
        "context-model-config",
        "config",
        "a `model_config` whose context is 8192, with the default grid",
        "isl + osl = 9216 exceeds model 'qwen3.5-35b-a3b-fp8''s context of 8192 tokens "
        "(max_position_embeddings = 8192 in models.qwen3.5-35b-a3b-fp8.model_config",
        edit=lambda c: c["models"]["qwen3.5-35b-a3b-fp8"].update(
            model_config=ODD, serve_args=[], block_shape=None, dtype="bf16"
        ),
    ),
    # --- sequential server starts need room to stop in; the margin must be a margin ---
    Probe(
        "starts-cap-below-min",
        "config",
        "`serve.starts: {min: 3, cap: 2}` (local)",
        "serve.starts.cap = 2: below serve.starts.min = 3",
        base="local",
        edit=lambda c: c["serve"].update(starts={"min": 3, "cap": 2}),
    ),
    Probe(
        "starts-float-count",
        "config",
        "`serve.starts: {min: 2.0, cap: 3}` (local)",
        "serve.starts.min = 2.0: must be an integer, written without a decimal point (2)",
        base="local",
        edit=lambda c: c["serve"].update(starts={"min": 2.0, "cap": 3}),
    ),
    Probe(
        "starts-zero",
        "config",
        "`serve.starts: {min: 0, cap: 3}` (local)",
        "serve.starts.min = 0: 0 is less than the minimum of 1",
        base="local",
        edit=lambda c: c["serve"].update(starts={"min": 0, "cap": 3}),
    ),
    Probe(
        "margin-zero",
        "config",
        "`report.min_change_pct: 0` (local)",
        "report.min_change_pct = 0: 0 is less than or equal to the minimum of 0",
        base="local",
        edit=lambda c: c.setdefault("report", {}).update(min_change_pct=0),
    ),
    Probe(
        "repeat-cap-removed",
        "config",
        "`serve.repeat_cap: 3`, the key server starts replaced (local)",
        "unknown key 'repeat_cap' in serve",
        base="local",
        edit=lambda c: c["serve"].update(repeat_cap=3),
    ),
    # --- issue 33 item 6: a one-of key missing names every alternative ---
    Probe(
        "model-neither-hf-id-nor-build",
        "config",
        "a model with neither `hf_id` nor `build` (local)",
        "models.tiny-qwen3-moe: give one of hf_id or build (none is set)",
        base="local",
        edit=_set("models", "tiny-qwen3-moe", "build", DELETE),
    ),
    Probe(
        "model-neither-production",
        "config",
        f"`models.{Q30}` without `hf_id` (production)",
        f"models.{Q30}: give one of hf_id or build (none is set)",
        edit=_set("models", Q30, "hf_id", DELETE),
    ),
]
