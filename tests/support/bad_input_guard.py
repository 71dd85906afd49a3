"""The bad-input catalogue's part for the config as the last stop: names that become folders,
YAML 1.1-only scalars, serve_args as the server's own parser reads them, credentials by value,
messages that say what is expected, and the plan's ceiling."""

import json

from support.bad_input_probes import Q30, Probe, _rename_image, _set

TINY = "tiny-qwen3-moe"
LONG = "m" * 300
LOCAL_GRID = "runtime: local\nserve:\n  grid:\n"
# Credential-shaped canaries, made up: none is a live credential.
CANARIES = {
    "url": ("DATABASE_URL", "postgres://admin:s3cr3t-canary@db.example:5432/bench"),
    "hf": ("MY_MODEL_READER", "hf_" + "Cb7qW2eR9tY4uI8oP3aS6dF1gH5jK0lZ"),
    "github": ("CI_MIRROR", "ghp_" + "Zq3Wx8Ec5Rv2Tb7Yn4Um1Ik6Ol9Pa0Sd3Fg"),
    "openai": ("JUDGE_ENDPOINT_KEYLESS", "sk-proj-" + "Qm4Nb8Vc2Xz6Lk9Jh3Gf7Ds1Aa5Pp0Oo"),
    "aws": ("S3_ID", "AKIA" + "Q7RZ2M4XK9TB3WJ5"),
    "jwt": ("SESSION", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJl"),
    "random": ("OPAQUE_VALUE", "Zx8Qp2LmN4vR7tY1uW3sK9bH6cJ0"),
}
KINDS = {
    "url": "a URL with a user name and password",
    "hf": "a Hugging Face token",
    "github": "a GitHub token",
    "openai": "an API key (sk-...)",
    "aws": "an AWS access key id",
    "jwt": "a JSON web token",
    "random": "a random-looking string of 20 or more characters",
}


def _rename_model(new: str):
    """Rename the local config's first model to ``new`` everywhere it is named."""

    def edit(cfg):
        cfg["models"] = {new: cfg["models"].pop(TINY), **cfg["models"]}
        for group in cfg["cells"]:
            group["models"] = [new if m == TINY else m for m in group["models"]]

    return edit


def _folder_probes() -> list[Probe]:
    rule = "expected letters, digits, '.', '_' and '-', starting with a letter or a digit"
    images = [
        ("plan", "results/plan/ is one of the pipeline's own folders"),
        ("README.md", "ends in '.md', like a file; " + rule),
        ("notes.json", "ends in '.json', like a file"),
        (LONG, f"images.{'m' * 37}...: the name becomes the folder results/NAME/ and 300"),
        ("-cpu", "starts with '-'; " + rule),
        ("host cpu", "holds ' '; " + rule),
        ("Plan", "results/Plan/ is one of the pipeline's own folders"),
    ]
    out = [
        Probe(
            f"image-folder-{i}",
            "config",
            f"an image named `{name if len(name) < 40 else 'm' * 8 + '...'}`"
            + (f" ({len(name)} characters)" if len(name) > 40 else ""),
            expected,
            base="local",
            edit=_rename_image(name),
        )
        for i, (name, expected) in enumerate(images)
    ]
    models = [
        (LONG, "300 characters, more than 100"),
        ("tiny moe", "holds ' '"),
        (".hidden", "starts with '.'"),
        ("tiny/moe", "holds '/'"),
        ("qwen-ü", "holds 'ü'"),
    ]
    out += [
        Probe(
            f"model-folder-{i}",
            "config",
            f"a model named `{name if len(name) < 40 else 'm' * 8 + '...'}`"
            + (f" ({len(name)} characters)" if len(name) > 40 else ""),
            expected + "; " + rule,
            base="local",
            edit=_rename_model(name),
        )
        for i, (name, expected) in enumerate(models)
    ]
    labels = [
        ("x" * 150, "150 characters, more than 100"),
        ("..", "'..' names a folder itself"),
        ("run.log", "ends in '.log', like a file"),
    ]
    out += [
        Probe(
            f"run-label-folder-{i}",
            "config",
            f"`run_label: {name if len(name) < 40 else 'x' * 8 + '...'}`",
            f"results/archive/LABEL/ and {expected}",
            base="local",
            edit=_set("run_label", name),
        )
        for i, (name, expected) in enumerate(labels)
    ]
    return out


def _yaml11_probes() -> list[Probe]:
    cases = [
        ("octal", "`isl: 040` (YAML 1.1 octal: 32)", "    - {isl: 040, osl: 8}\n",
         "line 4: 040 is a YAML 1.1 octal number (read as 32)"),
        ("base60", "`osl: 2:00` (YAML 1.1 base 60: 120)", "    - {isl: 32, osl: 2:00}\n",
         "line 4: 2:00 is a YAML 1.1 base-60 number (read as 120)"),
        ("base60-float", "`ready_timeout_s: 1:30.5`", None,
         "1:30.5 is a YAML 1.1 base-60 number (read as 90.5)"),
        ("underscore", "`isl: 1_024`", "    - {isl: 1_024, osl: 8}\n",
         "line 4: 1_024 is a YAML 1.1 number with '_' separators (read as 1024)"),
        ("binary", "`isl: 0b100000`", "    - {isl: 0b100000, osl: 8}\n",
         "line 4: 0b100000 is a YAML 1.1 binary number (read as 32)"),
        ("yes", "`interleave_arms: yes`", None,
         "yes is a YAML 1.1 boolean (read as true), a string in YAML 1.2; expected true or false"),
        ("off", "`ignore_eos: off`", None, "off is a YAML 1.1 boolean (read as false)"),
        ("on", "`ep: on` in a cell group", None, "on is a YAML 1.1 boolean (read as true)"),
    ]  # fmt: skip
    texts = {
        "base60-float": "runtime: local\nserve:\n  ready_timeout_s: 1:30.5\n",
        "yes": "runtime: local\nserve:\n  interleave_arms: yes\n",
        "off": "runtime: local\nserve:\n  ignore_eos: off\n",
        "on": "runtime: local\ncells:\n  - {images: [a], models: [m], tp: 2, ep: on}\n",
    }
    return [
        Probe(
            f"yaml11-{name}",
            "yaml",
            shown,
            expected,
            text=texts[name] if row is None else LOCAL_GRID + row,
        )
        for name, shown, row, expected in cases
    ]


def _serve_args_probes() -> list[Probe]:
    words = [
        ("port", ["--port 9000"], '["--port", "9000"]'),
        ("max-model-len", ["--max-model-len 4096"], '["--max-model-len", "4096"]'),
        ("dtype-eq", ["--gpu-memory-utilization 0.9", "--enforce-eager"],
         '["--gpu-memory-utilization", "0.9"]'),
    ]  # fmt: skip
    out = [
        Probe(
            f"serve-args-one-word-{name}",
            "config",
            f"`serve_args: {args}` (an option and its value in one entry)",
            f"models.{Q30}.serve_args[0] = {args[0]!r}: one entry holding an option and its "
            f"value, which the server gets as one word (an option of that whole name); "
            f"expected one entry per word: {split}",
            edit=_set("models", Q30, "serve_args", args),
        )
        for name, args, split in words
    ]
    out.append(
        Probe(
            "serve-args-empty-entry",
            "config",
            "`serve_args: ['']`",
            f"models.{Q30}.serve_args[0] = '': empty; expected an option",
            edit=_set("models", Q30, "serve_args", [""]),
        )
    )
    parser = [
        ("no-option", ["--max-model-len", "2048"], "No such option '--max-model-len'"),
        ("unknown-flag", ["--bogus-flag"], "No such option '--bogus-flag'"),
        ("bad-value", ["--cb-block-size", "x"],
         "Invalid value for '--cb-block-size': 'x' is not a valid integer"),
        ("missing-value", ["--model-timeout"], "Option '--model-timeout' requires an argument"),
    ]  # fmt: skip
    out += [
        Probe(
            f"serve-args-parser-{name}",
            "config",
            f"`serve_args: {args}` (local: transformers serve's parser)",
            f"models.{TINY}.serve_args = {json.dumps(args)}: transformers serve's own argument "
            f"parser refuses them: {expected}",
            base="local",
            edit=_set("models", TINY, "serve_args", args),
        )
        for name, args, expected in parser
    ]
    out.append(
        Probe(
            "serve-args-transformers-device",
            "config",
            "`serve_args: [--device, cuda]` (local: the pipeline sets transformers' device)",
            f"models.{TINY}.serve_args holds '--device' (as --device): the pipeline sets it",
            base="local",
            edit=_set("models", TINY, "serve_args", ["--device", "cuda"]),
        )
    )
    out.append(
        Probe(
            "serve-args-beyond-context",
            "config",
            "`serve_args: [--max-model-len, '99999999']` on a model whose context is 4096",
            f"models.{TINY}.serve_args --max-model-len 99999999: more than the model's context "
            "of 4096 tokens",
            base="local",
            edit=_set("models", TINY, "serve_args", ["--max-model-len", "99999999"]),
        )
    )
    return out


def _env(name: str, value: str):
    def edit(cfg):
        cfg["cells"][0]["env"] = {name: value}

    return edit


def _secret_probes() -> list[Probe]:
    out = [
        Probe(
            f"secret-value-{kind}",
            "config",
            f"`cells[0].env: {{{name}: ...}}`, the value {KINDS[kind].split(' (')[0]}",
            f"cells[0].env.{name}: the value looks like {KINDS[kind]}",
            base="local",
            edit=_env(name, value),
        )
        for kind, (name, value) in CANARIES.items()
    ]
    out.append(
        Probe(
            "secret-value-serve-args",
            "config",
            "`serve_args: [--api-key, sk-...]` (a key outside env)",
            f"models.{Q30}.serve_args[1]: the value looks like an API key",
            edit=_set("models", Q30, "serve_args", ["--api-key", CANARIES["openai"][1]]),
        )
    )
    out.append(
        Probe(
            "secret-value-dataset-url",
            "config",
            "`gsm8k.dataset: https://user:pw@host/gsm8k.jsonl`",
            "gsm8k.dataset: the value looks like a URL with a user name and password",
            edit=_set("gsm8k", "dataset", "https://reader:pw-canary@data.example/gsm8k.jsonl"),
        )
    )
    return out


def _message_probes() -> list[Probe]:
    cases = [
        ("block-shape-x", "`block_shape: 128x128`",
         f'models.{Q30}.block_shape = "128x128": expected "auto", null or a list of 2 integers'
         " >= 1 (e.g. [128, 128])", _set("models", Q30, "block_shape", "128x128")),
        ("block-shape-one", "`block_shape: [128]`",
         f"models.{Q30}.block_shape = [128]: expected a list of 2 integers >= 1",
         _set("models", Q30, "block_shape", [128])),
        ("repeats-minus-zero", "`serve.repeats: -0.0`",
         "serve.repeats = -0.0: expected an integer >= 1, written without a decimal point",
         _set("serve", "repeats", -0.0)),
        ("rocm-version-major", "`rocm_version: '7'`",
         'images.rocm7.0.rocm_version = "7": expected a version as MAJOR.MINOR',
         _set("images", "rocm7.0", "rocm_version", "7")),
        ("batch-sizes-tier", "`tune.batch_sizes: all`",
         'tune.batch_sizes = "all": expected one of "vllm_default", "aiter16" or a list of '
         "integers >= 1", _set("tune", "batch_sizes", "all")),
        ("burstiness-word", "`serve.burstiness: x`",
         'serve.burstiness = "x": expected a number > 0 or "inf"',
         _set("serve", "burstiness", "x")),
        ("ref-no-tag-words", "`ref: docker.io/rocm/vllm` (no tag), in words",
         "expected an image reference with a tag, REPOSITORY:TAG",
         _set("images", "rocm7.0", "ref", "docker.io/rocm/vllm")),
    ]  # fmt: skip
    return [Probe(f"says-{n}", "config", shown, exp, edit=edit) for n, shown, exp, edit in cases]


def _ceiling_probes() -> list[Probe]:
    # Through a real `snakemake -n`: the ceiling is checked above the loader (the plan's
    # estimate imports it), where the workflow and `cellbench cells` read the config.
    return [
        Probe(
            "ceiling-repeats-2-63",
            "snakemake",
            "`snakemake -n` with `serve.repeats: 9223372036854775808` (2^63)",
            "e+21 GPU-hours (plan.max_gpu_hours = 1000)",
            edit=_set("serve", "repeats", 2**63),
        ),
        Probe(
            "ceiling-gpu-hours",
            "snakemake",
            "`snakemake -n` with `plan.max_gpu_hours: 1` (the production config)",
            "GPU-hours (plan.max_gpu_hours = 1); the largest job is serve of",
            edit=_set("plan", {"max_gpu_hours": 1}),
        ),
        Probe(
            "ceiling-hours-local",
            "snakemake",
            "`snakemake -n` with `plan.max_hours: 0.1` (the embedded default, no GPUs)",
            "hours of jobs one after another (plan.max_hours = 0.1)",
            base="local",
            edit=_set("plan", {"max_hours": 0.1}),
        ),
    ]


PROBES: list[Probe] = [
    *_folder_probes(),
    *_yaml11_probes(),
    *_serve_args_probes(),
    *_secret_probes(),
    *_message_probes(),
    *_ceiling_probes(),
    Probe(
        "tune-out-empty",
        "cli",
        "`cellbench tune --out ''` (the working folder)",
        "--out '': empty; expected a folder to write into",
        argv=("tune", "--model-config", "tests/data/model_configs/qwen3-30b-a3b.json", "--out", ""),
    ),
    Probe(
        "snakemake-yaml11-octal",
        "snakemake",
        "`snakemake -n` with `isl: 040` (Snakemake's reader takes 32)",
        "040 is a YAML 1.1 octal number (read as 32)",
        text="runtime: local\nserve:\n  grid:\n    - {isl: 040, osl: 8}\n",
    ),
    Probe(
        "snakemake-secret-value",
        "snakemake",
        "`snakemake -n` with a password in an env value (the value is in no output)",
        "cells[0].env.DATABASE_URL: the value looks like a URL with a user name and password",
        base="local",
        edit=_env(*CANARIES["url"]),
    ),
]
