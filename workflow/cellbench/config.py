"""Load, validate and expand a cellbench configuration into cells.

The JSON schema (workflow/schemas/config.schema.yaml) checks structure and fills defaults;
the checks here are the ones a schema cannot express (names that must exist, TP against the
GPUs configured, EP with TP=1). Every failure is one ``ConfigError`` whose message names the
key and the value, so `snakemake -n` and `cellbench cells` say the same thing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# Batch-size tiers by name are the tuner's own lists (stdlib-only at import).
from cellbench.tuner.cli import BATCH_SIZE_TIERS

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"
ARMS = ("untuned", "tuned")


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and the value."""


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
    if error.validator == "oneOf" and error.context:
        # Report the alternative that came closest rather than "not valid under any".
        best = jsonschema.exceptions.best_match(error.context)
        return f"{key} = {value}: {best.message}"
    return f"{key} = {value}: {error.message}"


def _validator() -> type[jsonschema.protocols.Validator]:
    """A validator that also fills schema defaults, as snakemake.utils.validate does."""
    base = jsonschema.Draft202012Validator

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = json.loads(json.dumps(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Check ``config`` in place (filling defaults) and return it; raise ConfigError."""
    if not isinstance(config, dict) or not config:
        raise ConfigError(
            "the configuration is empty: pass --configfile config/local.yaml or config/config.yaml"
        )
    validator = _validator()(load_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise ConfigError(f"config error: {_schema_message(best)}")
    _check_semantics(config)
    return config


def _check_semantics(config: dict[str, Any]) -> None:
    images, models = config["images"], config["models"]
    runtime = config["runtime"]
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
        if runtime == "docker" and tp > config["gpus"]:
            raise ConfigError(
                f"config error: {where}.tp = {tp}: exceeds the {config['gpus']} "
                f"GPUs configured (gpus)"
            )
        if runtime == "docker" and config["serve"]["interleave_arms"] and 2 * tp > config["gpus"]:
            raise ConfigError(
                f"config error: {where}.tp = {tp}: serve.interleave_arms runs both arms' servers "
                f"at once and needs 2 x tp = {2 * tp} GPUs, but gpus = {config['gpus']} "
                "(set serve.interleave_arms: false to serve the arms one after the other)"
            )
        if group["ep"] and tp == 1:
            raise ConfigError(
                f"config error: {where}.ep = true with tp = 1: expert parallel "
                "needs more than one rank"
            )
    if config["serve"]["compare_images"]:
        _check_compare_images(config)
    for name, model in models.items():
        if model.get("build") and runtime == "docker":
            raise ConfigError(
                f"config error: models.{name}.build = {model['build']!r}: locally "
                "built models exist only for runtime: local"
            )
    for name, image in images.items():
        if runtime == "docker" and "rocm_version" not in image and config["gpu_vendor"] == "amd":
            raise ConfigError(
                f"config error: images.{name}: rocm_version is required for AMD "
                "images (it is checked against the image when pinning)"
            )
    if runtime == "docker" and config["gpu_vendor"] == "none":
        raise ConfigError(
            'config error: gpu_vendor = "none" with runtime: docker: the vLLM image needs GPUs'
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
    """Read a YAML config file and validate it."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    return validate(raw or {})


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
