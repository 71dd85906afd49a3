"""What a model's config.json says where it is known at plan time (a local folder, the
embedded default's recipe, or the Hugging Face cache): the MoE shape each cell will tune and
the context length its grid needs, checked before any job runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cellbench.config.strict_yaml import ConfigError


def model_config_at_plan_time(config: dict[str, Any], name: str) -> tuple[dict, str] | None:
    """(the model's config.json as a dict, where it came from), when known without a download:
    ``model_config``, a built model's recipe, or the Hugging Face cache (hf_cache); else None."""
    from cellbench.tune.shapes import ShapeError, read_model_config

    model = config["models"][name]
    where = f"models.{name}"
    if "model_config" in model:
        path = Path(model["model_config"]).expanduser()
        try:
            return read_model_config(path), f"{where}.model_config {str(path)!r}"
        except (ShapeError, OSError) as exc:
            raise ConfigError(
                f"config error: {where}.model_config = {model['model_config']!r}: {exc} "
                "(expected a model's config.json, JSON object)"
            ) from None
    if model.get("build"):
        from cellbench.assets.build import MAX_POSITION_EMBEDDINGS, MODEL_RECIPES

        shape = MODEL_RECIPES[model["build"]][0]
        cfg = {**shape, "max_position_embeddings": MAX_POSITION_EMBEDDINGS}
        return cfg, f"{where}.build {model['build']!r}"
    found = _cached_hub_file(Path(config["hf_cache"]).expanduser(), model["hf_id"])
    if found is None:
        return None
    try:
        return read_model_config(found), f"the Hugging Face cache's {found}"
    except (ShapeError, OSError):
        return None  # the tune job reads it again and says what is wrong


def _cached_hub_file(hf_cache: Path, repo_id: str, name: str = "config.json") -> str | None:
    """``name`` of the hub's main revision of ``repo_id`` as huggingface_hub caches it
    (hub/models--ORG--NAME/refs/main -> snapshots/REV/NAME), or None. Read by hand: importing
    huggingface_hub here would fix its offline switch before a caller sets it."""
    repo = hf_cache / "hub" / ("models--" + repo_id.replace("/", "--"))
    try:
        revision = (repo / "refs" / "main").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = repo / "snapshots" / revision / name
    return str(path) if revision and path.is_file() else None


def _serve_arg_value(args: list[str], option: str) -> str | None:
    """The value serve_args give ``option`` (either spelling), the last one winning."""
    value = None
    for i, arg in enumerate(args):
        if serve_arg_option(arg) != option:
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def check_model_shapes(config: dict[str, Any]) -> None:
    """The checks `cellbench shapes` makes (experts over the EP ranks, N over TP, block shape
    tiles), and the grid against the model's context, for each model whose config is known."""
    from cellbench.tune.shapes import ShapeError, moe_shape

    known: dict[str, tuple[dict, str] | None] = {}
    for i, group in enumerate(config["cells"]):
        for name in group["models"]:
            if name not in known:
                known[name] = model_config_at_plan_time(config, name)
            if known[name] is None:
                continue
            cfg, source = known[name]
            model, tp = config["models"][name], group["tp"]
            dtype = {"auto": "auto", "fp8_w8a8": "fp8_w8a8"}.get(model["dtype"])
            try:
                moe_shape(cfg, tp, bool(group["ep"]), dtype, model["block_shape"])
            except ShapeError as exc:
                layout = f"tp = {tp}" + (", ep = true" if group["ep"] else "")
                raise ConfigError(
                    f"config error: cells[{i}]: model {name!r} at {layout}: {exc} (read from "
                    f"{source}); expected a layout `cellbench shapes` accepts for this model"
                ) from None
    for name, found in known.items():
        _check_context(config, name, found)


def _check_context(config: dict[str, Any], name: str, found: tuple[dict, str] | None) -> None:
    """ISL + OSL of every grid point within the model's context: serve_args' --max-model-len
    when given (vLLM's limit then), else the config's max_position_embeddings when known."""
    args = config["models"][name]["serve_args"]
    given = _serve_arg_value(args, "--max-model-len")
    if given is not None:
        try:
            limit, what = int(given), f"models.{name}.serve_args --max-model-len {given}"
        except ValueError:
            return  # vLLM's own suffixes (32k); the server says what it makes of them
        _check_max_model_len(name, limit, found)
    elif found is None:
        return
    else:
        cfg, source = found
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        limit = text.get("max_position_embeddings")
        if isinstance(limit, bool) or not isinstance(limit, int):
            return
        what = f"max_position_embeddings = {limit} in {source}"
    for i, point in enumerate(config["serve"]["grid"]):
        total = point["isl"] + point["osl"]
        if total > limit:
            raise ConfigError(
                f"config error: serve.grid[{i}] = {{isl: {point['isl']}, osl: {point['osl']}}}: "
                f"isl + osl = {total} exceeds model {name!r}'s context of {limit} tokens "
                f"({what}); expected isl + osl <= {limit}"
            )


def _check_max_model_len(name: str, given: int, found: tuple[dict, str] | None) -> None:
    """vLLM refuses a --max-model-len beyond the model's own context (unless told to allow it
    by VLLM_ALLOW_LONG_MAX_MODEL_LEN); refused here, where the model's config is known and
    has no RoPE scaling that would lengthen it."""
    if found is None:
        return
    cfg, source = found
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    context = text.get("max_position_embeddings")
    if isinstance(context, bool) or not isinstance(context, int) or text.get("rope_scaling"):
        return
    if given > context:
        raise ConfigError(
            f"config error: models.{name}.serve_args --max-model-len {given}: more than the "
            f"model's context of {context} tokens (max_position_embeddings in {source}), which "
            f"vLLM refuses at start-up; expected --max-model-len <= {context}"
        )


def serve_arg_option(arg: str) -> str | None:
    """The option a serve_args word names as vLLM's parser reads it (None for a value):
    '--tensor_parallel_size=4' -> '--tensor-parallel-size'."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit() or arg[1:2] == ".":
        return None  # a value (negative numbers included)
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        # vLLM's FlexibleArgumentParser turns '_' into '-' in long option names.
        return "--" + name[2:].replace("_", "-")
    return name
