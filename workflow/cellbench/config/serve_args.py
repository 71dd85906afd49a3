"""A model's ``serve_args``, checked before any job runs: each entry one word, none of the
options the pipeline sets itself, and the whole command line parsed by the server's own
argument parser for the runtime in use (transformers serve in this process; vLLM's under
``serve.vllm_python`` or, on docker, inside the pinned image at the workflow's start).

A server that rejects its arguments fails only after its job started (and after the arm's
previous results were set aside), so the parse happens here, on the command line the
launcher would build (``cellbench.serve.server``).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellbench.common import atomicio
from cellbench.config.model_plan import serve_arg_option
from cellbench.config.strict_yaml import ConfigError

# Options the pipeline sets itself on every server; a model's serve_args may not repeat them,
# in any spelling vLLM's parser takes (underscores for dashes, '--opt=value', a unique prefix,
# the --no- form of a flag, a short form with its value attached).
RESERVED_SERVE_ARGS = (
    "--host",
    "--port",
    "--tensor-parallel-size",
    "-tp",
    "--enable-expert-parallel",
    "--no-enable-expert-parallel",
    "--served-model-name",
    "--model",
)

# Successful parses by vLLM's parser, keyed by interpreter or image digest and the arguments.
CACHE_DIR = Path(".snakemake") / "cellbench" / "serve-args"
VLLM_TIMEOUT_S = 300

# Run by the vLLM interpreter (the local one, or the image's): builds `vllm serve`'s own parser
# as vLLM's CLI does (its serve subcommand, then the subcommand's validate) and parses the
# words; prints one line, CELLBENCH-PARSE and a JSON verdict. Exit 3: vLLM not importable.
VLLM_PARSE = r"""
import contextlib, io, json, sys
def say(code, **kw):
    print("CELLBENCH-PARSE " + json.dumps(kw), flush=True)
    sys.exit(code)
try:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.cli.serve import ServeSubcommand
except Exception as exc:
    say(3, error=f"vLLM's serve parser cannot be imported here ({type(exc).__name__}: {exc})")
parser = FlexibleArgumentParser(prog="vllm")
command = ServeSubcommand()
command.subparser_init(parser.add_subparsers(required=False, dest="subparser"))
said = io.StringIO()
try:
    with contextlib.redirect_stderr(said):
        args = parser.parse_args(json.loads(sys.argv[1]))
    command.validate(args)
except SystemExit as exc:
    lines = [ln for ln in said.getvalue().splitlines() if ln.strip()]
    say(2, error=(lines[-1] if lines else f"the parser exited {exc.code}"))
except Exception as exc:
    say(2, error=f"{type(exc).__name__}: {exc}")
say(0, ok=True)
"""


@dataclass(frozen=True)
class Verdict:
    """A parser's answer: refused (its message), or not checked (why), or neither (parsed)."""

    refused: str | None = None
    unchecked: str | None = None


def reserved_serve_option(arg: str) -> str | None:
    """The reserved option a serve_args word would set, however it is spelled, else None."""
    option = serve_arg_option(arg)
    if option is None:
        return None
    if option in RESERVED_SERVE_ARGS:
        return option
    if option.startswith("--") and len(option) > 3:
        # argparse takes a unique prefix of a long option as the option itself.
        hits = [r for r in RESERVED_SERVE_ARGS if r.startswith("--") and r.startswith(option)]
        if len(hits) == 1:
            return hits[0]
    if not option.startswith("--") and option.startswith("-tp"):  # '-tp4' is '-tp 4'
        return "-tp"
    return None


def check_words(where: str, args: list[str]) -> None:
    """Each entry one word, and none the pipeline sets; raise ConfigError."""
    for i, arg in enumerate(args):
        head = arg.split("=", 1)[0]
        if arg.startswith("-") and head.split() != [head]:
            words = arg.split()
            raise ConfigError(
                f"config error: {where}.serve_args[{i}] = {arg!r}: one entry holding an option "
                "and its value, which the server gets as one word (an option of that whole "
                f"name); expected one entry per word: {json.dumps(words)}"
            )
        if not arg.strip():
            raise ConfigError(
                f"config error: {where}.serve_args[{i}] = {arg!r}: empty; expected an option "
                "(--name) or its value"
            )
        option = reserved_serve_option(arg)
        if option is not None:
            raise ConfigError(
                f"config error: {where}.serve_args holds {arg!r} (as {option}): the pipeline "
                "sets it for every server (from the cell's tp/ep, its model and the leased "
                "port); remove it"
            )


def _check_device(name: str, args: list[str]) -> None:
    """transformers serve's --device is the pipeline's (the CPU, or the GPUs of ``gpus``)."""
    for arg in args:
        if arg.split("=", 1)[0] == "--device":
            raise ConfigError(
                f"config error: models.{name}.serve_args holds {arg!r} (as --device): the "
                "pipeline sets it for transformers serve (cuda when gpus > 0, else cpu); "
                "remove it and set gpus instead"
            )


def _refusal(where: str, args: list[str], server: str, message: str) -> ConfigError:
    return ConfigError(
        f"config error: {where}.serve_args = {json.dumps(args)}: {server}'s own argument "
        f"parser refuses them: {message.strip().rstrip('.')}; expected arguments that {server} "
        "accepts (the pipeline adds the model, --host, --port and the parallel layout)"
    )


def _spec(config: dict[str, Any], name: str, **kw):
    from cellbench.serve.server import ServerSpec

    model = config["models"][name]
    return ServerSpec(
        model="MODEL",
        port=8000,
        log_path=Path("server.log"),
        served_model_name="MODEL",
        serve_args=list(model["serve_args"]),
        dtype=model["dtype"],
        **kw,
    )


def _transformers_parse(args: tuple[str, ...]) -> str | None:
    """transformers serve's own (click) parser on ``args``: its message, or None."""
    import click
    from transformers.cli.transformers import app

    try:
        app.commands["serve"].make_context("serve", list(args))
    except click.exceptions.ClickException as exc:
        return exc.format_message()
    return None


def _transformers_args(config: dict[str, Any], name: str) -> list[str]:
    from cellbench.serve import server

    cmd = server.local_command(_spec(config, name, runtime="local", server="transformers"))
    return cmd[cmd.index("cellbench.serve.tf_serve") + 1 :]


def _vllm_args(config: dict[str, Any], name: str) -> list[str]:
    """vLLM's words as the docker launcher passes them: `serve MODEL --host ... ARGS`."""
    from cellbench.serve import server

    cmd = server.docker_command(_spec(config, name, runtime="docker", image_ref="x:y"), "MODEL")
    return cmd[1:]


def _cache_file(key: dict[str, Any]) -> Path:
    blob = json.dumps(key, sort_keys=True).encode()
    return CACHE_DIR / f"{hashlib.sha256(blob).hexdigest()}.json"


def _remember(key: dict[str, Any]) -> None:
    """Record a successful parse (only successes: a refusal is parsed again once fixed)."""
    cache = _cache_file(key)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomicio.write_json(cache, {**key, "verdict": "ok"})
    except OSError:
        pass  # a read-only working folder: the parse is only repeated next time


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _run_vllm_parse(command: list[str], args: list[str], key: dict[str, Any]) -> Verdict:
    """Run VLLM_PARSE with ``command`` (an interpreter, or `docker run ... python`). A success
    is remembered per ``key``, so a config is parsed once per interpreter or image."""
    if _cache_file(key).is_file():
        return Verdict()
    try:
        proc = subprocess.run(
            [*command, "-c", VLLM_PARSE, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=VLLM_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Verdict(unchecked=f"the parser could not be run ({type(exc).__name__}: {exc})")
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("CELLBENCH-PARSE ")]
    if not said:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return Verdict(unchecked=f"the parser exited {proc.returncode} ({tail[0]})")
    verdict = json.loads(said[-1].split(" ", 1)[1])
    if verdict.get("ok"):
        _remember(key)
        return Verdict()
    if proc.returncode == 3:  # vLLM could not be imported: no verdict on the arguments
        return Verdict(unchecked=str(verdict.get("error")))
    return Verdict(refused=str(verdict.get("error")))


def _interpreter_key(python: Path) -> dict[str, Any]:
    """What names a local vLLM install: the interpreter and its vLLM package's change time."""
    found = sorted(python.parent.parent.glob("lib/python*/site-packages/vllm/__init__.py"))
    return {
        "python": str(python.resolve()),
        "vllm": found[0].stat().st_mtime_ns if found else None,
    }


def check_local(config: dict[str, Any]) -> None:
    """The local runtime: every used model's serve_args through its server's parser (a model
    without serve_args has nothing of the user's to parse)."""
    if config["runtime"] != "local":
        return
    server = config["serve"]["server"]
    used = {m for group in config["cells"] for m in group["models"]}
    for name in sorted(m for m in used if config["models"][m]["serve_args"]):
        given = config["models"][name]["serve_args"]
        if server == "transformers":
            _check_device(name, given)
            args = _transformers_args(config, name)
            key = {"where": f"transformers {_version('transformers')}", "args": args}
            message = None if _cache_file(key).is_file() else _transformers_parse(tuple(args))
            if message is not None:
                raise _refusal(f"models.{name}", given, "transformers serve", message)
            _remember(key)
            continue
        python = Path(config["serve"]["vllm_python"]).expanduser()
        args = _vllm_args(config, name)
        verdict = _run_vllm_parse(
            [str(python)], args, {"where": _interpreter_key(python), "args": args}
        )
        if verdict.refused:
            raise _refusal(f"models.{name}", given, "vLLM", verdict.refused)
        if verdict.unchecked:
            # This interpreter is the server's: no usable vLLM there is no server either.
            raise ConfigError(
                f"config error: serve.vllm_python = {config['serve']['vllm_python']!r}: "
                f"{verdict.unchecked}, so models.{name}.serve_args cannot be checked and the "
                "server could not start; expected an interpreter with vLLM installed"
            )


def check_images(config: dict[str, Any], refs: dict[str, str]) -> tuple[list[str], list[str]]:
    """The docker runtime, at the workflow's start: each cell's serve_args through the vLLM
    parser inside its pinned image (``refs``: image name -> repo@digest). Returns the
    refusals and the warnings (an image whose parser could not be run: the server will say
    what it makes of the arguments), one line each."""
    refused, warnings = [], []
    seen = set()
    for group in config["cells"]:
        for image in group["images"]:
            for name in group["models"]:
                if not config["models"][name]["serve_args"] or (image, name) in seen:
                    continue
                seen.add((image, name))
                args = _vllm_args(config, name)
                python = config["images"][image].get("python", "python3")
                command = ["docker", "run", "--rm", "--network", "none", "--entrypoint", python]
                key = {"where": refs[image], "args": args}
                verdict = _run_vllm_parse([*command, refs[image]], args, key)
                server = f"the vLLM of image {image} ({refs[image]})"
                if verdict.refused:
                    serve_args = config["models"][name]["serve_args"]
                    refused.append(
                        str(_refusal(f"models.{name}", serve_args, server, verdict.refused))
                    )
                elif verdict.unchecked:
                    warnings.append(
                        f"models.{name}.serve_args not checked against {server}: "
                        f"{verdict.unchecked}"
                    )
    return refused, warnings
