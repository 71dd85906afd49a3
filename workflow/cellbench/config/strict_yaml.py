"""Reading config files: strict YAML (a key given twice is refused, naming both lines) and the
one error every config check raises (``ConfigError``, naming the key and the value).
"""

from __future__ import annotations

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
        _read_mapping(path)


def _read_mapping(path: str | Path) -> dict[str, Any] | None:
    data = read_yaml(path)
    if data is not None and not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r}: the top level must be a mapping of keys "
            f"(runtime:, images:, ...), not a {type(data).__name__}"
        )
    return data
