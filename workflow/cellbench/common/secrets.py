"""Secrets: the variables the pipeline passes through to its jobs by name and never writes out,
and what a value that holds a credential looks like (so a config never carries one).

Lives at the bottom so the config check, the job command lines and the containers share one list.
"""

from __future__ import annotations

import math
import re
from collections import Counter

SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN")

# Credentials by their published shapes: the provider's prefix and the body's length.
TOKEN_SHAPES = (
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "a Hugging Face token (hf_...)"),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
     "a GitHub token (ghp_..., github_pat_...)"),
    # sk-, sk-proj-, ...: a body with a run of 20 without '-' (a model id's words are shorter)
    (re.compile(r"\bsk-(?:[a-z]+-)?(?=[A-Za-z0-9_-]*[A-Za-z0-9_]{20})[A-Za-z0-9_-]{20,}"),
     "an API key (sk-...)"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key id (AKIA...)"),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), "a GitLab token (glpat-...)"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), "a Slack token (xox...-)"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), "a Google API key (AIza...)"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\."), "a JSON web token"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.I),
     "a URL with a user name and password"),
)  # fmt: skip

# A random-looking run of base64/base62 characters: long, all three character classes, near
# the entropy of random text, and changing between upper case, lower case and digits at most
# characters (words in camel case change far less). Runs stop at '-', '_', '/' and '.', so
# model ids, paths and variable-like names are not taken for keys.
_RUN = re.compile(r"[A-Za-z0-9+=]{20,}")
MIN_ENTROPY_BITS = 3.6
MIN_CHANGES = 0.4  # class changes per character; random base62 text makes about 0.6


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _class(c: str) -> int:
    return 0 if c.islower() else 1 if c.isupper() else 2


def _random_looking(run: str) -> bool:
    classes = {_class(c) for c in run}
    changes = sum(_class(a) != _class(b) for a, b in zip(run, run[1:], strict=False))
    return (
        len(classes) == 3 and changes >= MIN_CHANGES * len(run) and _entropy(run) > MIN_ENTROPY_BITS
    )


def credential_kind(value: str, *, random_runs: bool = True) -> str | None:
    """What kind of credential ``value`` looks like, or None (never the value itself).
    ``random_runs``: also a random-looking run of 20 or more characters (for variables' values,
    where such a run is a key; other settings hold ids and paths)."""
    for pattern, kind in TOKEN_SHAPES:
        if pattern.search(value):
            return kind
    if random_runs and any(_random_looking(m.group(0)) for m in _RUN.finditer(value)):
        return "a random-looking string of 20 or more characters (a key or token)"
    return None
