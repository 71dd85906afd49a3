"""Prompts for the load generator: random token sequences of exactly ``isl`` tokens under the
model's tokenizer (a local ``tokenizer.json``, or the server's ``/tokenize`` and
``/detokenize``), drawn from a fixed seed.

Split out of ``cellbench.serve.loadgen``: what is sent, apart from how it is
sent (``cellbench.serve.sse_client``) and measured (``loadgen``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import requests

_COMMON_WORDS = (
    "the of and to in is was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she "
    "which do their time if will way about many then them write would like so these her long "
    "make thing see him two has look more day could go come did number sound no most people "
    "my over know water than call first who may down side been now find any new work part "
    "take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low "
    "line differ turn cause much mean before move right boy old too same tell does set three "
    "want air well also play small end put home read hand port large spell add even land here "
    "must big high such follow act why ask men change went light kind off need house picture "
    "try us again animal point mother world near build self earth father head stand own page"
).split()


class Tokenizer(Protocol):
    """The little the load generator needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def candidate_ids(self) -> list[int]: ...


class LocalTokenizer:
    """A ``tokenizers`` tokenizer loaded from a model directory's ``tokenizer.json``."""

    def __init__(self, model_dir: Path):
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in model dir {model_dir}")
        self._tok = HFTokenizer.from_file(str(path))
        special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        vocab = self._tok.get_vocab(with_added_tokens=True)
        ids = sorted(i for t, i in vocab.items() if t not in special)
        # Prefer " word" tokens that round-trip alone: joined, they split back at the spaces
        # into the same ids, so random prompts have their intended length at the first try.
        stable = []
        for i in ids:
            text = self._tok.decode([i])
            if len(text) > 1 and text[0] == " " and text[1:].isalnum() and self.encode(text) == [i]:
                stable.append(i)
        self._ids = stable if len(stable) >= 50 else ids

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def candidate_ids(self) -> list[int]:
        return self._ids


class ServerTokenizer:
    """Tokenise through a server's ``/tokenize`` and ``/detokenize`` (vLLM has both)."""

    def __init__(self, base_url: str, model_id: str, vocab_size: int | None = None):
        self._base = base_url.rstrip("/")
        self._model = model_id
        self._s = requests.Session()
        self._vocab = vocab_size
        self._candidates: list[int] | None = None

    def encode(self, text: str) -> list[int]:
        r = self._s.post(
            f"{self._base}/tokenize",
            json={"model": self._model, "prompt": text, "add_special_tokens": False},
            timeout=60,
        )
        r.raise_for_status()
        return list(r.json()["tokens"])

    def decode(self, ids: Sequence[int]) -> str:
        r = self._s.post(
            f"{self._base}/detokenize",
            json={"model": self._model, "tokens": list(ids)},
            timeout=60,
        )
        r.raise_for_status()
        return str(r.json()["prompt"])

    def candidate_ids(self) -> list[int]:
        # The vocabulary is not served, so learn ids from common words: " word" tokens join and
        # split back cleanly, where arbitrary ids (byte pieces) would not round-trip.
        if self._candidates is None:
            ids = sorted(set(self.encode(" " + " ".join(_COMMON_WORDS))))
            self._candidates = (
                ids if len(ids) >= 50 else list(range(min(self._vocab or 1000, 1000)))
            )
        return self._candidates


def load_tokenizer(model: str, base_url: str | None = None, model_id: str | None = None):
    """A local tokenizer when ``model`` is a directory with tokenizer.json, else the server's."""
    p = Path(model)
    if (p / "tokenizer.json").is_file():
        return LocalTokenizer(p)
    if base_url is None:
        raise ValueError(f"model {model!r} has no local tokenizer.json and no server was given")
    return ServerTokenizer(base_url, model_id or model)


@dataclass
class Prompt:
    """One request's prompt and its true length in tokens."""

    text: str
    prompt_len: int


def make_prompts(tok: Tokenizer, n: int, isl: int, seed: int) -> list[Prompt]:
    """``n`` random prompts of exactly ``isl`` tokens (re-encoded until stable)."""
    if isl < 1:
        raise ValueError(f"isl must be >= 1, got isl={isl}")
    rng = random.Random(seed)
    ids_pool = tok.candidate_ids()
    out: list[Prompt] = []
    for _ in range(n):
        ids = [rng.choice(ids_pool) for _ in range(isl)]
        text = tok.decode(ids)
        for _attempt in range(20):
            ids = tok.encode(text)
            if len(ids) == isl:
                break
            # Decoding and re-encoding can merge or split tokens: trim or top up, then retry.
            ids = ids[:isl] if len(ids) > isl else ids + [rng.choice(ids_pool)]
            text = tok.decode(ids)
        else:
            raise RuntimeError(f"could not make a prompt of exactly {isl} tokens")
        out.append(Prompt(text, isl))
    return out
