"""Reading config files: strict YAML (a key given twice is refused, naming both lines; a plain
scalar that YAML 1.1 and 1.2 read differently is refused, naming its line) and the one error
every config check raises (``ConfigError``, naming the key and the value).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

# yaml.safe_load keeps the last of two equal keys without a word; a config with `runtime:`
# twice would silently run the second. This loader refuses it, naming both lines.


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and the value."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding the same key twice."""

    source = "<string>"


def _construct_strict_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # SafeLoader's own error names an unhashable key
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise ConfigError(
                f"config file {loader.source!r}, line {line}: duplicate key {key!r} "
                f"(first at line {first_line[key]}); YAML would keep only the last one, "
                "so remove one of them"
            )
        first_line[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_strict_mapping
)


# PyYAML reads YAML 1.1, where `040` is octal 32, `2:00` is base 60 (120), `1_000` is 1000 and
# `on`/`yes`/`off`/`no` are booleans; YAML 1.2 (and most other readers) take the first three
# as 40, a string and a string, and the words as strings. A config means one thing to every
# reader, so a plain scalar of these forms is refused; quoting it makes it a string.
_YAML11_ONLY = (
    (re.compile(r"^[-+]?0[0-7_]+$"), "a YAML 1.1 octal number", "without the leading zero"),
    (re.compile(r"^[-+]?0b[01_]+$"), "a YAML 1.1 binary number", "in decimal"),
    (
        re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$"),
        "a YAML 1.1 base-60 number",
        "as one number (seconds, not h:mm)",
    ),
    (
        re.compile(r"^[-+]?(?:[0-9][0-9]*_[0-9_]*|[0-9_]*_[0-9_]*\.[0-9_]*)$"),
        "a YAML 1.1 number with '_' separators",
        "without the '_'",
    ),
)
_YAML11_BOOLS = frozenset("yes Yes YES no No NO on On ON off Off OFF".split())


def _refuse_yaml11(loader: _StrictLoader, node: yaml.ScalarNode, read_as: Any) -> None:
    where = f"config file {loader.source!r}, line {node.start_mark.line + 1}"
    value = node.value
    if value in _YAML11_BOOLS:
        raise ConfigError(
            f"{where}: {value} is a YAML 1.1 boolean (read as {str(read_as).lower()}), a string "
            f'in YAML 1.2; expected true or false, or "{value}" quoted for the word'
        )
    for pattern, what, fix in _YAML11_ONLY:
        if pattern.match(value):
            raise ConfigError(
                f"{where}: {value} is {what} (read as {read_as}), which YAML 1.2 reads "
                f'differently; expected the number written {fix}, or "{value}" quoted for '
                "a string"
            )


def _checked(base):
    def construct(loader: _StrictLoader, node: yaml.ScalarNode):
        value = base(loader, node)
        if node.style is None:  # plain: a quoted scalar is a string in every YAML version
            _refuse_yaml11(loader, node, value)
        return value

    return construct


for _tag, _base in (
    ("tag:yaml.org,2002:int", yaml.SafeLoader.construct_yaml_int),
    ("tag:yaml.org,2002:float", yaml.SafeLoader.construct_yaml_float),
    ("tag:yaml.org,2002:bool", yaml.SafeLoader.construct_yaml_bool),
):
    _StrictLoader.add_constructor(_tag, _checked(_base))


def read_yaml(path: str | Path) -> Any:
    """Parse one YAML file strictly; a ConfigError names the file and line of any fault."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc}") from None
    loader = _StrictLoader(text)
    loader.source = str(path)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = ": ".join(x for x in (exc.context, exc.problem) if x)
        raise ConfigError(f"config file {str(path)!r}{where}: not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def check_files(paths) -> None:
    """Re-read config files that another reader (Snakemake) already merged, strictly: a
    duplicate key, which that reader drops silently, raises ConfigError naming file and lines."""
    for path in paths:
        read_mapping(path)


def read_mapping(path: str | Path) -> dict[str, Any] | None:
    data = read_yaml(path)
    if data is not None and not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r}: the top level must be a mapping of keys "
            f"(runtime:, images:, ...), not a {type(data).__name__}"
        )
    return data
