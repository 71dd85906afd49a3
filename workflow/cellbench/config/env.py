"""The config's environment variables (images.*.env, models.*.env, cells[*].env): checked
names and values, secret-looking names and credential-looking values refused, and the
variables one cell gets.

Applied alike to the tuner's step and to both arms' servers of every cell they reach; a cell
group's value wins over its model's, which wins over its image's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cellbench.config.strict_yaml import ConfigError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# Set by the pipeline itself, per job or per arm; a config value would fight it.
RESERVED_ENV = {
    "VLLM_TUNED_CONFIG_FOLDER": "the pipeline sets it per arm (the tuned arm's folder, none for "
    "the untuned arm)",
    "CELLBENCH_PORT": "the pipeline sets it to the job's leased port",
    "CUDA_VISIBLE_DEVICES": "the pipeline's GPU leases set it",
    "HIP_VISIBLE_DEVICES": "the pipeline's GPU leases set it",
    "ROCR_VISIBLE_DEVICES": "the pipeline's GPU leases set it",
    "PYTHONPATH": "the pipeline points it at its own code",
    "HF_HOME": "the pipeline mounts the Hugging Face cache (hf_cache) and sets it",
}


# Words of a variable's name (split at '_') that say it holds a credential: tokens, keys,
# secrets, passwords, personal access tokens (GITHUB_PAT), credentials and cloud access keys
# (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AZURE_CLIENT_SECRET, AWS_SESSION_TOKEN,
# GOOGLE_APPLICATION_CREDENTIALS), auth headers and cookies. Whole words, so TOKENIZERS_PARALLELISM
# stays allowed; a word that ends in one of SECRET_SUFFIXES (HFTOKEN, OPENAIAPIKEY) counts too.
SECRET_WORDS = frozenset(
    {
        "TOKEN", "TOKENS", "KEY", "KEYS", "APIKEY", "SECRET", "SECRETS", "PASSWORD",
        "PASSWORDS", "PASSWD", "PASS", "PASSPHRASE", "PAT", "CREDENTIAL", "CREDENTIALS",
        "CRED", "CREDS", "AUTH", "AUTHORIZATION", "COOKIE", "COOKIES", "NETRC", "PRIVATE",
    }
)  # fmt: skip


SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY")


SECRET_RULE = (
    "names with a word (between '_') TOKEN, KEY, APIKEY, SECRET, PASSWORD, PASSWD, PASS, "
    "PASSPHRASE, PAT, CREDENTIAL(S), CRED(S), AUTH, AUTHORIZATION, COOKIE, NETRC or PRIVATE, "
    f"or a word ending in {', '.join(SECRET_SUFFIXES)}"
)


def env_name_is_secret(name: str) -> bool:
    """Whether a variable's name says it holds a credential (SECRET_WORDS, SECRET_SUFFIXES)."""
    words = [w for w in name.upper().split("_") if w]
    return any(w in SECRET_WORDS or w.endswith(SECRET_SUFFIXES) for w in words)


def _secret_refusal(key: str) -> str:
    # Imported here: the container module pulls in nothing heavy, but config must stay light.
    from cellbench.common.secrets import SECRET_ENV

    return (
        f"config error: {key}: looks like a secret, refused in favour of the pass-through "
        "list: a config's variables travel on job command lines and into Snakemake's records "
        "and logs. Export it on the host instead; the pipeline passes through the names of "
        f"cellbench.common.secrets.SECRET_ENV ({', '.join(SECRET_ENV)}) and writes their values in "
        f"no log (secret-looking: {SECRET_RULE})"
    )


def _check_env(where: str, env: Any) -> None:
    """One ``env`` mapping of the config: NAME: "value", both strings, nothing reserved."""
    if not isinstance(env, dict):
        raise ConfigError(
            f"config error: {where} = {json.dumps(env, default=str)}: must be a mapping of "
            'variable names to string values (NAME: "value")'
        )
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise ConfigError(
                f"config error: {where}: variable name {name!r} is not valid (letters, digits "
                "and '_', not starting with a digit)"
            )
        key = f"{where}.{name}"
        if env_name_is_secret(name):
            raise ConfigError(_secret_refusal(key))
        if name in RESERVED_ENV:
            raise ConfigError(
                f"config error: {key}: {RESERVED_ENV[name]}; remove it from the config"
            )
        if isinstance(value, bool):
            raise ConfigError(
                f"config error: {key} = {str(value).lower()}: YAML read the value as a boolean; "
                'quote the value you mean (e.g. "1" or "true") so it is a string'
            )
        if isinstance(value, (int, float)):
            raise ConfigError(
                f"config error: {key} = {value}: YAML read the value as a number; quote it "
                f'({name}: "{value}") so it is a string'
            )
        if value is None:
            raise ConfigError(
                f'config error: {key} has no value: give a string ("" for an empty one)'
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"config error: {key} = {json.dumps(value, default=str)}: must be a string"
            )
        if "\0" in value:
            raise ConfigError(f"config error: {key}: the value holds a NUL character")


def _strings(node: Any, key: str = ""):
    """(key path, value) of every string in a parsed config."""
    if isinstance(node, str):
        yield key, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{key}[{i}]")


def check_secret_values(config: dict[str, Any]) -> None:
    """No value of the config may hold a credential (a token of a known shape, a URL with a
    password, or, in a variable's value, a random-looking key): a config's values reach job
    command lines, logs, results, archives and Snakemake's records. The message names the key
    and the kind, never the value."""
    from cellbench.common.secrets import SECRET_ENV, credential_kind

    for key, value in _strings(config):
        in_env = re.search(r"(^|\.)env\.[^.]+$", key) is not None
        kind = credential_kind(value, random_runs=in_env)
        if kind:
            raise ConfigError(
                f"config error: {key}: the value looks like {kind}; a config's values are "
                "written to job command lines, logs, results, archives and Snakemake's records, "
                "so a credential is refused (its value is not shown). Expected a value without "
                "one; a Hugging Face token is passed through from the host by name "
                f"({', '.join(SECRET_ENV)})"
            )


def check_envs(config: dict[str, Any]) -> None:
    for section in ("images", "models"):
        entries = config.get(section)
        for name, entry in entries.items() if isinstance(entries, dict) else ():
            if isinstance(entry, dict) and "env" in entry:
                _check_env(f"{section}.{name}.env", entry["env"])
    groups = config.get("cells")
    for i, group in enumerate(groups if isinstance(groups, list) else ()):
        if isinstance(group, dict) and "env" in group:
            _check_env(f"cells[{i}].env", group["env"])


def cell_env(config: dict[str, Any], image: str, model: str, tp: int, ep: int) -> dict[str, str]:
    """The variables a cell's tuner and servers get: the image's, overlaid by the model's, then
    by those of the cell groups that hold the cell (two groups that set one name to different
    values are refused: neither would be more specific). Sorted by name, so it compares."""
    env = dict(config["images"][image].get("env") or {})
    env.update(config["models"][model].get("env") or {})
    from_group: dict[str, tuple[int, str]] = {}
    for i, group in enumerate(config["cells"]):
        if image not in group["images"] or model not in group["models"] or group["tp"] != tp:
            continue
        if (group["tp"] if group.get("ep") else 1) != ep:
            continue
        for name, value in (group.get("env") or {}).items():
            if name in from_group and from_group[name][1] != value:
                j = from_group[name][0]
                raise ConfigError(
                    f"config error: cells[{i}].env.{name} = {value!r} and cells[{j}].env.{name}"
                    f" = {from_group[name][1]!r} both apply to cell {image}/{model}/tp{tp}-ep{ep}"
                    "; set it in one group only"
                )
            from_group[name] = (i, value)
    env.update({name: value for name, (_, value) in from_group.items()})
    return dict(sorted(env.items()))
