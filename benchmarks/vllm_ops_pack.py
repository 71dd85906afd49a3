#!/usr/bin/env python3
"""vLLM's compiled MoE ops, packed small enough to travel to a GPU machine without network.

vLLM's fused call runs, around its Triton GEMMs, compiled ops from two libraries of its wheel:
`_moe_C_stable_libtorch.abi3.so` (moe_align_block_size, moe_sum) and
`_C_stable_libtorch.abi3.so` (silu_and_mul, per_token_group_fp8_quant). Built on torch's
stable ABI, they load into another torch than the one they were built with. Together they are
118 MB, more than a device call's working tree may hold (64 MiB), so this script:

1. extracts both from vLLM's wheel (and the Python wrappers vLLM calls them through:
   vllm/_custom_ops.py, vllm/model_executor/layers/fused_moe/moe_align_block_size.py);
2. in each library's CUDA fat binary, overwrites with zeros the payload of every entry a
   compute-capability 9.0 GPU (H100, H200) never loads: cubins of other architectures (a cubin
   runs only on its own major architecture) and, in a fat binary that holds an sm_90 cubin,
   its PTX. Entry headers, sizes and everything outside those payloads stay byte for byte, so
   the ELF layout is unchanged; the sm_90 cubins are vLLM's as built;
3. compresses each with xz (the zeros vanish) and records what it did in SOURCE.json (wheel
   name and sha256, each library's sha256 before and after, bytes kept and zeroed).

On the GPU machine `--unpack DIR` writes the libraries back out and checks their sha256
against SOURCE.json. A library trimmed this way is still vLLM's code for sm_90, but only
a correctness check on the GPU shows it loads and computes right: `cellbench.tune.
vllm_source.load_vllm_ops` runs one before any op is used.

Standard library only.

Usage: python3 benchmarks/vllm_ops_pack.py [--wheel W] [--dest .vllm-src/vllm-0.34.0-ops]
       python3 benchmarks/vllm_ops_pack.py --unpack DIR [--dest ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import struct
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.34.0"
DEFAULT_DEST = ROOT / ".vllm-src" / f"vllm-{VERSION}-ops"
LIBS = ("vllm/_moe_C_stable_libtorch.abi3.so", "vllm/_C_stable_libtorch.abi3.so")
PY_FILES = ("vllm/_custom_ops.py", "vllm/model_executor/layers/fused_moe/moe_align_block_size.py")
KEEP_ARCH = 90  # sm_90 and sm_90a (Hopper)
_FATBIN_MAGIC = 0xBA55ED50
_CUBIN, _PTX = 2, 1


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _section(elf: bytes, name: bytes) -> tuple[int, int] | None:
    """(file offset, size) of a section of a 64-bit little-endian ELF, or None."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    str_off = struct.unpack_from("<Q", elf, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        h = shoff + i * shentsize
        name_off = struct.unpack_from("<I", elf, h)[0]
        end = elf.index(b"\0", str_off + name_off)
        if elf[str_off + name_off : end] == name:
            off, size = struct.unpack_from("<QQ", elf, h + 0x18)
            return off, size
    return None


def _entries(data: bytes, start: int, end: int):
    """(offset, kind, header size, payload size, arch) of each entry of one fat binary."""
    q = start
    while q < end:
        kind, _ver, head, size = struct.unpack_from("<HHIQ", data, q)
        arch = struct.unpack_from("<I", data, q + 28)[0]
        yield q, kind, head, size, arch
        q += head + size


def trim(lib: bytes) -> tuple[bytes, dict]:
    """The library with the payloads an sm_90 GPU never loads zeroed, and what was done."""
    sec = _section(lib, b".nv_fatbin")
    if sec is None:
        raise ValueError("no .nv_fatbin section")
    data = bytearray(lib)
    off, size = sec
    p, end = off, off + size
    stats = {"fatbins": 0, "without_sm90_cubin": 0, "kept_bytes": 0, "zeroed_bytes": 0,
             "kept_sm90_cubins": 0}  # fmt: skip
    while p + 16 <= end:
        magic, _ver, head, body = struct.unpack_from("<IHHQ", data, p)
        if magic != _FATBIN_MAGIC:
            p += 8  # fat binaries are 8-byte aligned in the section
            continue
        stats["fatbins"] += 1
        ents = list(_entries(data, p + head, p + head + body))
        has90 = any(k == _CUBIN and a == KEEP_ARCH for _, k, _, _, a in ents)
        stats["without_sm90_cubin"] += not has90
        for q, kind, ehead, esize, arch in ents:
            drop = (kind == _CUBIN and arch != KEEP_ARCH) or (
                kind == _PTX and (has90 or arch > KEEP_ARCH)
            )
            if drop:
                data[q + ehead : q + ehead + esize] = bytes(esize)
                stats["zeroed_bytes"] += esize
            else:
                stats["kept_bytes"] += esize
                stats["kept_sm90_cubins"] += kind == _CUBIN
        p += head + body
    if stats["kept_sm90_cubins"] == 0:
        raise ValueError("no sm_90 cubin in the fat binaries: nothing would run on Hopper")
    return bytes(data), stats


def pack(wheel: Path, dest: Path) -> dict:
    record: dict = {"package": "vllm", "version": VERSION, "wheel": wheel.name,
                    "wheel_sha256": _sha256(wheel.read_bytes()), "kept_arch": f"sm_{KEEP_ARCH}",
                    "libraries": {}, "python_files": list(PY_FILES)}  # fmt: skip
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        missing = [f for f in (*LIBS, *PY_FILES) if f not in names]
        if missing:
            raise SystemExit(f"{wheel}: lacks {', '.join(missing)}; expected vLLM {VERSION}")
        for f in PY_FILES:
            out = tmp / f
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(f))
        for f in LIBS:
            lib = z.read(f)
            small, stats = trim(lib)
            name = Path(f).name
            (tmp / f"{name}.xz").write_bytes(lzma.compress(small, preset=6))
            record["libraries"][name] = {"original_sha256": _sha256(lib),
                                         "original_bytes": len(lib),
                                         "trimmed_sha256": _sha256(small), **stats}  # fmt: skip
            print(f"{name}: {len(lib)} bytes, {stats['zeroed_bytes']} zeroed, "
                  f"{(tmp / f'{name}.xz').stat().st_size} compressed", flush=True)  # fmt: skip
    (tmp / "SOURCE.json").write_text(json.dumps(record, indent=1) + "\n")
    if dest.exists():
        import shutil

        shutil.rmtree(dest)
    tmp.rename(dest)
    return record


def unpack(src: Path, out: Path) -> int:
    rec = json.loads((src / "SOURCE.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    for name, info in rec["libraries"].items():
        data = lzma.decompress((src / f"{name}.xz").read_bytes())
        if _sha256(data) != info["trimmed_sha256"]:
            print(f"{name}: sha256 differs from SOURCE.json's", file=sys.stderr)
            return 1
        part = out / f".{name}.part"
        part.write_bytes(data)
        part.rename(out / name)
    for f in rec["python_files"]:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        (out / f).write_bytes((src / f).read_bytes())
    (out / "SOURCE.json").write_text(json.dumps(rec, indent=1) + "\n")
    print(f"{out}: {', '.join(rec['libraries'])} (checked against SOURCE.json)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", default=None, help="default: .vllm-src/wheels/vllm-0.34.0-*.whl")
    ap.add_argument("--dest", default=str(DEFAULT_DEST))
    ap.add_argument("--unpack", default=None, metavar="DIR",
                    help="write the packed libraries into DIR (on the GPU machine)")  # fmt: skip
    a = ap.parse_args()
    dest = Path(a.dest)
    if a.unpack:
        if not (dest / "SOURCE.json").is_file():
            print(f"--dest {dest}: no packed ops (run this script without --unpack first)",
                  file=sys.stderr)  # fmt: skip
            return 2
        return unpack(dest, Path(a.unpack))
    if a.wheel:
        wheel = Path(a.wheel)
    else:
        found = sorted((ROOT / ".vllm-src" / "wheels").glob(f"vllm-{VERSION}-*.whl"))
        if not found:
            print(f"no vLLM {VERSION} wheel in .vllm-src/wheels: download it with "
                  f"pip download vllm=={VERSION} --no-deps -d .vllm-src/wheels, or pass --wheel",
                  file=sys.stderr)  # fmt: skip
            return 2
        wheel = found[0]
    if not wheel.is_file():
        print(f"--wheel {wheel}: no such file", file=sys.stderr)
        return 2
    pack(wheel, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
