"""The verdict tests must be able to fail: four mutations of the serving statistics, each
applied to a copy of the tracked tree, and the tests that fail under it.

1. spending removed: every look of the sequential rule tests at the full row level;
2. variance components replaced by a constant: the one function every serving test takes its
   variance from returns a fixed 5% start-to-start spread;
3. the verdict always "inconclusive";
4. the verdict always "changed" (better or worse by the sign of the change).

    .venv/bin/python benchmarks/verdict_mutations.py [OUT_FILE]

runs tests/unit/test_calibration.py, test_starts.py and test_sequential.py once unchanged and
once per mutation (about 20 s each on 2 cores) and prints, per mutation, the failing tests.
Exit status 1 when the unchanged tree fails or a mutation fails no test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/unit/test_calibration.py",
    "tests/unit/test_starts.py",
    "tests/unit/test_sequential.py",
]
STARTS = "workflow/cellbench/stats/starts.py"
SEQUENTIAL = "workflow/cellbench/stats/sequential.py"
CODE = "    code = np.where(changed, np.where(better, 1, -1), np.where(inside, 2, 0))"
VARIANCE = (
    '    arrays; with neither, (NaN, 0). The one place every serving test takes its variance."""'
)
SPENDING = "        if not self.spending:  # each look at the full level"
MUTATIONS = {
    "spending removed": (
        SEQUENTIAL,
        SPENDING,
        "        if True:  # mutation: no spending\n"
        "            return dict.fromkeys(self.looks, row_alpha)\n" + SPENDING,
    ),
    "variance components replaced by a constant": (
        STARTS,
        VARIANCE,
        VARIANCE + "\n    return 0.05**2 + 0 * np.nan_to_num(np.asarray(var_data, float)), "
        "max(df_data, 1)  # mutation: a constant",
    ),
    "verdict always inconclusive": (
        STARTS,
        CODE,
        "    code = np.zeros(np.shape(est), int)  # mutation: always inconclusive",
    ),
    "verdict always changed": (
        STARTS,
        CODE,
        "    code = np.where(better, 1, -1)  # mutation: always changed",
    ),
}


def copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        target = dest / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_file():
            shutil.copy2(src, target)


def failing(tree: Path) -> tuple[list[str], str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "workflow")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:warnings", "-p",
         "no:cacheprovider"],
        cwd=tree, env=env, capture_output=True, text=True,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    failed = [ln.split(" - ")[0].removeprefix("FAILED ") for ln in lines if ln.startswith("FAILED")]
    return failed, lines[-1] if lines else proc.stderr[-500:]


def main(argv: list[str]) -> int:
    out, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree)
        failed, summary = failing(tree)
        out += ["unchanged tree: " + summary]
        ok &= not failed
        for name, (path, old, new) in MUTATIONS.items():
            text = (tree / path).read_text()
            if text.count(old) != 1:
                raise SystemExit(f"{name}: the line to mutate is not in {path} once")
            (tree / path).write_text(text.replace(old, new))
            failed, summary = failing(tree)
            (tree / path).write_text(text)
            out += ["", f"mutation: {name} ({path}): {summary}", *[f"  {t}" for t in failed]]
            ok &= bool(failed)
    text = "\n".join(out) + "\n"
    print(text, end="")
    if len(argv) > 1:
        Path(argv[1]).write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
