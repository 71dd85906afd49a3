"""A planted series of nightlies in the local registry: images that differ only in one runtime
setting, ``PLANTED_ITL_MS``, the inter-token time the stand-in server (the project's timed
server, started inside each image) is given. The base is the registry's rocm7.2 test image
(.ci/docker-up.sh) with the timed server's aiohttp added, which the test image lacks."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from support.docker_env import TEST_REPO, TEST_TAGS, _push, pinned

VENV_SITE = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages"
AIOHTTP = ("aiohttp", "multidict", "yarl", "frozenlist", "aiosignal", "attr", "attrs",
           "propcache", "aiohappyeyeballs", "idna", "typing_extensions.py")  # fmt: skip
# What the bisect starts in each image instead of `vllm serve` ({port} filled in; the model
# id is the name the pipeline serves a model under, its config name).
SERVER_COMMAND = (
    "sh -c 'python3 -m cellbench.serve.timed_server --port {port} --model-id tiny-a "
    "--ttft-ms 20 --itl-ms $PLANTED_ITL_MS'"
)


def _base(client, work: Path) -> str:
    ctx = work / "planted-base"
    (ctx / "site").mkdir(parents=True, exist_ok=True)
    for name in AIOHTTP:
        src = VENV_SITE.resolve() / name
        dst = ctx / "site" / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    (ctx / "Dockerfile").write_text(
        f"FROM {pinned(client, TEST_TAGS['7.2'])}\n"
        "COPY site/ /usr/local/lib/python3.11/dist-packages/\n"
    )
    image, _ = client.images.build(path=str(ctx), rm=True, pull=False)
    return image.id


def push_series(client, work: Path, itl_ms: list[str]) -> tuple[str, list[str]]:
    """One image per value of ``itl_ms`` (a value that is not a number makes a server that
    cannot start), tagged ``<prefix>-nightly-202612DD`` (day = position + 1) and pushed;
    returns the prefix and the tags, oldest first."""
    base = _base(client, work)
    prefix = f"planted-{uuid.uuid4().hex[:8]}"
    tags = []
    for i, itl in enumerate(itl_ms):
        import io

        dockerfile = f"FROM {base}\nENV PLANTED_ITL_MS={itl}\nLABEL org.cellbench.planted={i}\n"
        image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True,
                                       pull=False)  # fmt: skip
        tag = f"{TEST_REPO}:{prefix}-nightly-202612{i + 1:02d}"
        image.tag(tag)
        _push(client, tag)
        tags.append(tag)
    return prefix, tags
