"""Inputs of the embedded default, made locally and offline.

* ``make_tiny_model``: a random-weight Qwen3-MoE model (hidden 64, moe_intermediate_size 32,
  8 experts, top-2, 2 layers) with a byte-level BPE tokenizer trained here, saved so that
  ``transformers serve`` and ``AutoTokenizer`` load it without the Hugging Face hub. Its fused-MoE
  shape is E=8, N=32, K=64, top-2 (TP=2 without expert parallel gives N=16).
* ``make_model(kind="small-qwen3-moe")``: the same recipe at the per-layer shapes of
  Qwen3-30B-A3B (hidden 2048, moe_intermediate_size 768, 128 experts, top-8, 32 query heads
  and 4 KV heads of 128) with 8 layers instead of 48 and the tiny model's 1024-token
  vocabulary, in bf16: about 10 GB of weights, 97 % of them experts, so its fused-MoE
  shape (E=128, N=768, K=2048) and the tuned file's name are those of the real model's layers
  and the MoE layers dominate a forward pass. Meant for a GPU (weights are drawn there when
  one is present); ``--num-layers`` shrinks it for a CPU check.
* ``make_gsm8k_set``: deterministic GSM8K-format arithmetic word problems (``question`` and an
  ``answer`` ending ``#### N``) split into test and train JSONL; ``gsm8k.dataset`` names the
  test file and the project's own task (``cellbench.gsm8k.evaluate``) runs on it.

Both builders write into a temporary sibling directory and rename it into place at the end, so
a half-built asset never looks complete.

CLI::

    python -m cellbench.assets model --out DIR [--kind tiny-qwen3-moe|small-qwen3-moe]
                                           [--seed 0] [--vocab-size 1024] [--num-layers N]
    python -m cellbench.assets gsm8k --out DIR [--n 50] [--n-train 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cellbench.common import atomicio

# The generated set: GSM8K runs read the test file (gsm8k.dataset); the project's task
# (cellbench.gsm8k.evaluate) draws few-shot examples from the test file's other questions, so the
# train file is not read by the pipeline.
GSM8K_TEST_FILE = "gsm8k_test.jsonl"
GSM8K_TRAIN_FILE = "gsm8k_train.jsonl"

# Shape of the tiny model; tests and the tuner read these rather than repeating numbers.
TINY_MODEL_SHAPE = {
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}

# A second tiny shape, so the embedded default has two cells that each serve what they tune:
# twice the experts and width, top-4 (file name E=16,N=64,...).
TINY_16E_MODEL_SHAPE = {
    **TINY_MODEL_SHAPE,
    "moe_intermediate_size": 64,
    "num_experts": 16,
    "num_experts_per_tok": 4,
}

# Qwen3-30B-A3B's per-layer shapes (its config.json), fewer layers: the tuned config's file
# name (E=128,N=768,...) is the real model's, and the experts hold ~97 % of the weights.
SMALL_MODEL_SHAPE = {
    "hidden_size": 2048,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 8,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
}

# Context length of every built model (its config's max_position_embeddings); the config
# check refuses grid points longer than this before any job.
MAX_POSITION_EMBEDDINGS = 4096

# Model kinds the workflow can build (config key ``models.<name>.build``): shape, the dense
# MLP width (unused: every layer is sparse) and the dtype the weights are saved in.
MODEL_RECIPES = {
    "tiny-qwen3-moe": (TINY_MODEL_SHAPE, 128, "float32"),
    "tiny-qwen3-moe-16e": (TINY_16E_MODEL_SHAPE, 128, "float32"),
    "small-qwen3-moe": (SMALL_MODEL_SHAPE, 6144, "bfloat16"),
}
MODEL_KINDS = set(MODEL_RECIPES)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as Qwen models use; cheap and lets /v1/chat/completions work.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@contextmanager
def _atomic_dir(out_dir: Path) -> Iterator[Path]:
    """Yield a temp dir next to ``out_dir``; on success replace ``out_dir`` with it."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        # mkdtemp makes the folder 0700 and some writers (safetensors) leave files 0600:
        # colleagues and containers running as another user must read them.
        atomicio.publish_tree(tmp)
        if out_dir.exists():
            # Move the old one aside first so the final rename is a single step.
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "x")
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------
# GSM8K-format problems


_NAMES = ["Ava", "Ben", "Chloe", "Dan", "Ella", "Finn", "Grace", "Hugo", "Iris", "Jack", "Kara"]
_ITEMS = ["apples", "marbles", "books", "stickers", "pencils", "cookies", "stamps", "shells"]
_PRICED = ["notebook", "sandwich", "ticket", "toy car", "plant", "scarf"]


def _p_buy_give(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c = rng.randint(5, 60), rng.randint(2, 40), rng.randint(1, 20)
    mid = a + b
    c = min(c, mid)
    res = mid - c
    q = (
        f"{name} has {a} {item}. {name} gets {b} more {item} and then gives {c} {item} "
        f"to a friend. How many {item} does {name} have now?"
    )
    steps = [
        f"After getting more, {name} has {a} + {b} = <<{a}+{b}={mid}>>{mid} {item}.",
        f"After giving some away, {name} has {mid} - {c} = <<{mid}-{c}={res}>>{res} {item}.",
    ]
    return q, steps, res


def _p_price(rng: random.Random) -> tuple[str, list[str], int]:
    name, thing = rng.choice(_NAMES), rng.choice(_PRICED)
    n, price, paid_extra = rng.randint(2, 12), rng.randint(2, 25), rng.randint(1, 30)
    cost = n * price
    paid = cost + paid_extra
    q = (
        f"{name} buys {n} of the same {thing} for ${price} each and pays with ${paid}. "
        f"How much change, in dollars, does {name} get back?"
    )
    steps = [
        f"The {thing}s cost {n} * {price} = <<{n}*{price}={cost}>>{cost} dollars.",
        f"The change is {paid} - {cost} = <<{paid}-{cost}={paid_extra}>>{paid_extra} dollars.",
    ]
    return q, steps, paid_extra


def _p_share(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    friends, share = rng.randint(2, 9), rng.randint(2, 12)
    total = friends * share
    # Pick a box count that divides the total so every number in the story is whole.
    boxes = rng.choice([d for d in range(2, 10) if total % d == 0] or [1])
    per_box = total // boxes
    q = (
        f"{name} has {boxes} boxes with {per_box} {item} in each box. {name} shares all the "
        f"{item} equally among {friends} friends. How many {item} does each friend get?"
    )
    steps = [
        f"There are {boxes} * {per_box} = <<{boxes}*{per_box}={total}>>{total} {item}.",
        f"Each friend gets {total} / {friends} = <<{total}/{friends}={share}>>{share} {item}.",
    ]
    return q, steps, share


def _p_weekly(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(_NAMES)
    per_day, days, weeks = rng.randint(2, 15), rng.randint(2, 7), rng.randint(2, 5)
    per_week = per_day * days
    res = per_week * weeks
    q = (
        f"{name} reads {per_day} pages a day, {days} days a week. "
        f"How many pages does {name} read in {weeks} weeks?"
    )
    steps = [
        f"Each week {name} reads {per_day} * {days} = <<{per_day}*{days}={per_week}>>{per_week} "
        "pages.",
        f"In {weeks} weeks that is {per_week} * {weeks} = <<{per_week}*{weeks}={res}>>{res} pages.",
    ]
    return q, steps, res


_PROBLEMS: list[Callable[[random.Random], tuple[str, list[str], int]]] = [
    _p_buy_give,
    _p_price,
    _p_share,
    _p_weekly,
]


def gsm8k_problems(n: int, seed: int) -> list[dict[str, str]]:
    """Return ``n`` deterministic GSM8K-format records ``{"question", "answer"}``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got n={n}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        q, steps, res = _PROBLEMS[i % len(_PROBLEMS)](rng)
        out.append({"question": q, "answer": "\n".join(steps) + f"\n#### {res}"})
    return out


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def make_gsm8k_set(out_dir: Path, n: int, seed: int = 0, *, n_train: int = 20) -> Path:
    """Write the test and train JSONL files (and meta.json) into ``out_dir``."""
    if n < 1:
        raise ValueError(f"gsm8k set: n must be >= 1, got n={n}")
    if n_train < 1:
        raise ValueError(f"gsm8k set: n_train must be >= 1, got n_train={n_train}")
    out_dir = Path(out_dir).resolve()
    # Train and test come from one stream so no question appears in both.
    rows = gsm8k_problems(n + n_train, seed)
    train, test = rows[:n_train], rows[n_train:]
    with _atomic_dir(out_dir) as tmp:
        _write_jsonl(tmp / GSM8K_TEST_FILE, test)
        _write_jsonl(tmp / GSM8K_TRAIN_FILE, train)
        meta = {"n_test": n, "n_train": n_train, "seed": seed}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out_dir


# ---------------------------------------------------------------------------------------------
# Tokenizer and model


def _tokenizer_corpus(seed: int) -> Iterator[str]:
    """Text to train the tokenizer on: the problems plus prompt scaffolding and digits."""
    for r in gsm8k_problems(600, seed + 1):
        yield f"Question: {r['question']}\nAnswer: {r['answer']}\n\n"
    yield "".join(f"{i} " for i in range(1000))
    yield "the of and to a in is it you that he was for on are with as I his they be at one"


def train_tokenizer(vocab_size: int, seed: int):  # -> transformers.PreTrainedTokenizerFast
    """Train a byte-level BPE tokenizer offline and wrap it for ``transformers``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(out_dir: Path, *, seed: int = 0, vocab_size: int = 1024) -> Path:
    """Build the tiny random Qwen3-MoE model and its tokenizer into ``out_dir`` (atomic)."""
    return make_model(out_dir, "tiny-qwen3-moe", seed=seed, vocab_size=vocab_size)


def make_model(
    out_dir: Path,
    kind: str = "tiny-qwen3-moe",
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    num_layers: int | None = None,
    device: str | None = None,
) -> Path:
    """Build a random-weight Qwen3-MoE model of ``kind`` and its tokenizer into ``out_dir``
    (atomic). ``num_layers`` overrides the kind's layer count; ``device`` is where the weights
    are drawn (default: the first GPU when there is one, else the CPU; the same seed gives
    other weights on another device)."""
    if kind not in MODEL_RECIPES:
        raise ValueError(f"model kind {kind!r} unknown; expected one of {sorted(MODEL_KINDS)}")
    if vocab_size < 300:
        # Byte-level BPE needs 256 base symbols plus the special tokens.
        raise ValueError(f"{kind}: vocab_size must be >= 300, got vocab_size={vocab_size}")
    if num_layers is not None and num_layers < 1:
        raise ValueError(f"{kind}: num_layers must be >= 1, got num_layers={num_layers}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    shape, dense_width, dtype_name = MODEL_RECIPES[kind]
    shape = dict(shape)
    if num_layers is not None:
        shape["num_hidden_layers"] = num_layers
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    out_dir = Path(out_dir).resolve()
    tok = train_tokenizer(vocab_size, seed)
    eos_id = tok.convert_tokens_to_ids("<|endoftext|>")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = Qwen3MoeConfig(
        vocab_size=len(tok),
        intermediate_size=dense_width,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        bos_token_id=eos_id,
        eos_token_id=[eos_id, im_end],
        pad_token_id=eos_id,
        **shape,
    )
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(seed)
    if dtype == torch.float32:
        model = Qwen3MoeForCausalLM(cfg).to(torch.float32).eval()
    else:
        # Drawn in the saved dtype on the target device: no float32 copy of ~5 GB of experts.
        with torch.device(device):
            model = Qwen3MoeForCausalLM._from_config(cfg, dtype=dtype).eval()
    with _atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        GenerationConfig(
            eos_token_id=[eos_id, im_end], pad_token_id=eos_id, do_sample=False
        ).save_pretrained(tmp)
        fm = {"E": cfg.num_experts, "N": cfg.moe_intermediate_size, "K": cfg.hidden_size}
        fm["topk"] = cfg.num_experts_per_tok
        meta = {"kind": kind, "built_by": "cellbench.assets", "weights": "random", "seed": seed}
        meta.update(vocab_size=len(tok), fused_moe_shape=fm)
        meta.update(dtype=dtype_name, num_hidden_layers=cfg.num_hidden_layers)
        meta["parameters"] = sum(p.numel() for p in model.parameters())
        meta["drawn_on"] = "cpu" if dtype == torch.float32 else str(device)
        (tmp / "cellbench_model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m cellbench.assets", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="what", required=True)
    pm = sub.add_parser("model", help="build a random-weight Qwen3-MoE model and tokenizer")
    pm.add_argument("--out", required=True, type=Path)
    pm.add_argument(
        "--kind", choices=sorted(MODEL_KINDS), default="tiny-qwen3-moe", help="which model to build"
    )
    pm.add_argument("--seed", type=int, default=0)
    pm.add_argument("--vocab-size", type=int, default=1024)
    pm.add_argument("--num-layers", type=int, default=None, help="override the kind's layer count")
    pg = sub.add_parser("gsm8k", help="write the GSM8K-format set (JSONL)")
    pg.add_argument("--out", required=True, type=Path)
    pg.add_argument("--n", type=int, default=50, help="test questions")
    pg.add_argument("--n-train", type=int, default=20, help="train/fewshot questions")
    pg.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.what == "model":
        print(
            make_model(a.out, a.kind, seed=a.seed, vocab_size=a.vocab_size, num_layers=a.num_layers)
        )
    else:
        print(make_gsm8k_set(a.out, a.n, a.seed, n_train=a.n_train))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
