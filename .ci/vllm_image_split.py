"""Split several site-packages folders into what they share and what each adds (stdlib only).

Used by .ci/vllm-images.sh to give the vLLM rehearsal images one shared base layer. A top-level
entry of site-packages (a package folder, a module, a .dist-info folder) is shared when it
exists in every folder and every distribution that installed files under it is installed at
the same version with the same RECORD (same files, same hashes) in every folder. Everything
else, including entries no RECORD names, belongs to each folder's own layer.

Writes into --out: shared.txt (entries, copied from the first folder), own-<i>.txt (entries of
folder i outside the shared set), shared.key (a hash of the shared distributions, so the base
image is rebuilt only when they change).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path


def owners(site: Path) -> tuple[dict[str, set[str]], dict[str, bytes]]:
    """Top-level entry -> names of the .dist-info folders whose RECORD lists files under it,
    and .dist-info name -> its RECORD bytes."""
    owned: dict[str, set[str]] = {}
    records: dict[str, bytes] = {}
    for info in sorted(site.glob("*.dist-info")):
        record = info / "RECORD"
        if not record.is_file():
            continue
        kept = []
        for line in record.read_bytes().decode("utf-8", "replace").splitlines():
            path = line.split(",", 1)[0]
            # Files outside site-packages (console scripts, whose shebang names the venv) and
            # byte code (stamped at install time) differ between two installs of one wheel;
            # neither is copied into an image.
            if path.startswith(("../", "/")) or "__pycache__/" in path:
                continue
            kept.append(line)
            owned.setdefault(path.split("/", 1)[0], set()).add(info.name)
        records[info.name] = "\n".join(sorted(kept)).encode()
        owned.setdefault(info.name, set()).add(info.name)
    return owned, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("sites", nargs="+", type=Path)
    args = ap.parse_args()
    tables = [owners(s) for s in args.sites]
    entries = [{p.name for p in s.iterdir() if p.name not in ("__pycache__",)} for s in args.sites]
    shared: list[str] = []
    for name in sorted(set.intersection(*entries)):
        dists = [t[0].get(name) for t in tables]
        if not dists[0] or any(d != dists[0] for d in dists):
            continue
        if all(all(t[1].get(d) == tables[0][1].get(d) for d in dists[0]) for t in tables):
            shared.append(name)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shared.txt").write_text("".join(f"{e}\n" for e in shared))
    for i, names in enumerate(entries):
        own = sorted(names - set(shared))
        (args.out / f"own-{i}.txt").write_text("".join(f"{e}\n" for e in own))
    key_dists = sorted({d for e in shared for d in tables[0][0][e]})
    digest = hashlib.sha256()
    for d in key_dists:
        digest.update(d.encode() + b"\0" + tables[0][1][d])
    (args.out / "shared.key").write_text(digest.hexdigest()[:16] + "\n")
    sizes = [len(shared)] + [len(n - set(shared)) for n in entries]
    print(f"vllm_image_split: {sizes[0]} shared entries; own entries per folder: {sizes[1:]}")


if __name__ == "__main__":
    main()
