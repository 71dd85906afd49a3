"""Names that become folders: image and model names (results/IMAGE/MODEL/...) and the run
label (results/archive/LABEL/...), checked as path components before the schema sees them, so
a bad name is told what is expected rather than the schema's bare pattern."""

from __future__ import annotations

import re
from typing import Any

from cellbench.config.strict_yaml import ConfigError

MAX_NAME = 100  # well under the 255 bytes of a file name, with the rest of a result's path
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
NAME_RULE = (
    "letters, digits, '.', '_' and '-', starting with a letter or a digit, "
    f"at most {MAX_NAME} characters"
)

# Names results/ uses for its own folders: an image so named would put its cells among them
# (results/report/..., which the report job swaps out whole; results/plan/, the estimate's).
RESULTS_LAYOUT_NAMES = (
    "archive",
    "assets",
    "benchmarks",
    "compare",
    "configs",
    "gates",
    "logs",
    "plan",
    "report",
)

# A name ending like a file the pipeline or a reader writes would sit beside such files
# (results/README.md is one) and read as a file, not a folder.
FILE_SUFFIXES = frozenset(
    "md json jsonl yaml yml txt html csv log sha256 lock tmp gz tar zip png svg pdf".split()
)


def _problem(name: str) -> str | None:
    """Why ``name`` cannot be a folder of results/, else None."""
    if not name:
        return "is empty"
    if len(name) > MAX_NAME:
        return f"{len(name)} characters, more than {MAX_NAME}"
    if name in (".", ".."):
        return f"{name!r} names a folder itself, not a new one"
    if not NAME.match(name):
        bad = sorted({c for c in name if not re.match(r"[A-Za-z0-9._-]", c)})
        if bad:
            return "holds " + ", ".join(repr(c) for c in bad)
        return f"starts with {name[:1]!r}"
    suffix = name.rsplit(".", 1)[1].lower() if "." in name else ""
    if suffix in FILE_SUFFIXES:
        return f"ends in '.{suffix}', like a file"
    return None


def _shown(name: str) -> str:
    return name if len(name) <= 40 else name[:37] + "..."


def check(config: dict[str, Any]) -> None:
    """Image and model names and the run label as folder names; raise ConfigError."""
    for section, folder in (("images", "results/NAME/"), ("models", "results/IMAGE/NAME/")):
        names = config.get(section)
        for name in names if isinstance(names, dict) else ():
            if not isinstance(name, str):
                continue  # the loader names a key YAML read as a number
            problem = _problem(name)
            if problem:
                raise ConfigError(
                    f"config error: {section}.{_shown(name)}: the name becomes the folder "
                    f"{folder} and {problem}; expected {NAME_RULE}"
                )
            if section == "images" and name.lower() in RESULTS_LAYOUT_NAMES:
                raise ConfigError(
                    f"config error: images.{name}: results/{name}/ is one of the pipeline's own "
                    f"folders ({', '.join(RESULTS_LAYOUT_NAMES)}), so the name {name!r} is taken "
                    "by the results layout; rename the image"
                )
    label = config.get("run_label")
    if isinstance(label, str):
        problem = _problem(label)
        if problem:
            raise ConfigError(
                f'config error: run_label = "{_shown(label)}": it becomes the folder '
                f"results/archive/LABEL/ and {problem}; expected {NAME_RULE}"
            )
