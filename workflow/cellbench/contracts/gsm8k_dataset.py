"""Which GSM8K question set a config names, as the config, the serve job and the GSM8K stage
all read it: the hub's set, a local JSON-lines file, or the set the embedded default generates
(one folder per question count).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

HUB_DATASET = "openai/gsm8k"
# A hub id: owner/name (a dataset's, or a model's).
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# The files the embedded default's gsm8k_set rule writes (gsm8k.local_questions > 0), one
# folder per question count: a set depends on its count alone (a fixed seed), so configs that
# ask for the same count share its files and a config asking for another never rewrites them.
GENERATED_DIR = "results/assets/gsm8k/n{n}"
_GENERATED_RE = re.compile(r"^results/assets/gsm8k/(?:n\d+/)?gsm8k_test\.jsonl$")


def generated_dataset(local_questions: int) -> str:
    """The gsm8k.dataset value naming the set of ``local_questions`` questions."""
    return f"{GENERATED_DIR.format(n=local_questions)}/gsm8k_test.jsonl"


def is_generated_dataset(dataset: str) -> bool:
    """Whether ``dataset`` names a set the gsm8k_set rule writes (of any count)."""
    return bool(_GENERATED_RE.match(dataset))


def dataset_problem(dataset: Any) -> str | None:
    """What is wrong with a ``gsm8k.dataset`` value, or None: a local ``.jsonl`` file that
    exists, or a hub id ``owner/name``."""
    if not isinstance(dataset, str) or not dataset:
        return f"{dataset!r} is neither a hub id (owner/name) nor a local .jsonl path"
    if dataset.endswith(".jsonl"):
        path = Path(dataset).expanduser()
        if not path.is_file():
            return f"{dataset!r}: no such JSONL file"
        return None
    if not HUB_ID.match(dataset):
        return f"{dataset!r} is neither a hub id (owner/name, e.g. {HUB_DATASET}) nor a .jsonl path"
    return None


def is_local_dataset(dataset: str) -> bool:
    """Whether ``dataset`` names a local JSONL file (else a hub id)."""
    return dataset.endswith(".jsonl")
