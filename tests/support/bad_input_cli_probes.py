"""The bad-input catalogue's last part: the config file itself, the cellbench command line, bad
CLI values and paths, and a few probes through a real `snakemake -n`."""

from pathlib import Path

from support.bad_input_probes import (  # noqa: F401
    DELETE,
    MOE,
    ODD,
    Q30,
    SMALL,
    Probe,
    _base,
    _rename_image,
    _set,
    _with_model_config,
)

ROOT = Path(__file__).resolve().parents[2]

PROBES: list[Probe] = [
    # --- the file itself ---
    Probe(
        "file-missing", "yaml", "`--configfile` names no file", "does not exist", text="<missing>"
    ),
    Probe("file-empty", "yaml", "an empty file", "the configuration is empty", text=""),
    Probe(
        "yaml-syntax",
        "yaml",
        "an unclosed `[` on line 2",
        "line 3, column 1: not valid YAML",
        text="runtime: local\nimages: [a\n",
    ),
    Probe(
        "yaml-tab",
        "yaml",
        "a tab indenting line 2",
        "line 2, column 1: not valid YAML",
        text="serve:\n\trepeats: 3\n",
    ),
    Probe(
        "yaml-top-level-list",
        "yaml",
        "a list at the top level",
        "the top level must be a mapping",
        text="- runtime: local\n",
    ),
    Probe(
        "duplicate-key",
        "yaml",
        "`runtime:` on lines 1 and 5",
        "line 5: duplicate key 'runtime' (first at line 1)",
        text=SMALL + "runtime: docker\n",
    ),
    Probe(
        "duplicate-nested-key",
        "yaml",
        "`repeats:` twice under `serve:`",
        "line 3: duplicate key 'repeats' (first at line 2)",
        text="serve:\n  repeats: 3\n  repeats: 5\n",
    ),
    Probe(
        "numeric-image-name",
        "yaml",
        "an image named `7.0:` (YAML reads a number)",
        'images: the name 7.0 was read as a number; quote it ("7.0")',
        text="runtime: docker\nimages:\n  7.0:\n    ref: a/b:c\n"
        "models: {m: {hf_id: a/b}}\ncells: [{images: ['7.0'], models: [m], tp: 1}]\n",
    ),
    # --- the cellbench command line ---
    Probe(
        "shapes-ep-tp1",
        "cli",
        "`cellbench shapes --tp 1 --ep`",
        "--ep with --tp 1: expert parallel needs more than one rank",
        argv=("shapes", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--tp", "1", "--ep"),
    ),
    Probe(
        "tune-ep-tp1",
        "cli",
        "`cellbench tune --tp 1 --ep`",
        "--ep with --tp 1: expert parallel needs more than one rank",
        argv=(
            "tune",
            "--model-config",
            f"{MOE}/qwen3-30b-a3b.json",
            "--tp",
            "1",
            "--ep",
            "--out",
            "{tmp}/tune-out",
        ),
    ),
    Probe(
        "shapes-device-slash",
        "cli",
        "`cellbench shapes --device-name a/b`",
        "--device-name 'a/b': it becomes part of a file name, so it may hold only letters",
        argv=("shapes", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--device-name", "a/b"),
    ),
    Probe(
        "tune-device-comma",
        "cli",
        "`cellbench tune --device-name 'MI300,X'`",
        "--device-name 'MI300,X': it becomes part of a file name",
        argv=(
            "tune",
            "--model-config",
            f"{MOE}/qwen3-30b-a3b.json",
            "--device-name",
            "MI300,X",
            "--out",
            "{tmp}/tune-out",
        ),
    ),
    Probe(
        "shapes-tp0",
        "cli",
        "`cellbench shapes --tp 0`",
        "--tp=0 must be >= 1",
        argv=("shapes", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--tp", "0"),
    ),
    Probe(
        "model-config-missing-cli",
        "cli",
        "`cellbench shapes --model-config` a missing file",
        "model config not found: /nonexistent/config.json",
        argv=("shapes", "--model-config", "/nonexistent/config.json"),
    ),
    Probe(
        "model-config-not-json",
        "cli",
        "a model config that is not JSON",
        "is not valid JSON",
        argv=("shapes", "--model-config", "{tmp}/broken.json"),
    ),
    Probe(
        "model-not-moe",
        "cli",
        "a dense (non-MoE) model config",
        "dense.json: model config has no expert-count field",
        argv=("shapes", "--model-config", "{tmp}/dense.json"),
    ),
    Probe(
        "hub-unreachable",
        "cli",
        "a hub id while the hub cannot be reached (offline)",
        "could not fetch config.json of 'nosuchorg/nosuchmodel' from the Hugging Face hub",
        argv=("shapes", "--model-config", "nosuchorg/nosuchmodel"),
        env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": "{tmp}/hf"},
    ),
    Probe(
        "tune-batch-sizes",
        "cli",
        "`cellbench tune --batch-sizes 1,x`",
        "--batch-sizes: 'x' is not an integer",
        argv=("tune", "--model-config", "x", "--batch-sizes", "1,x", "--out", "{tmp}/tune-out"),
    ),
    Probe(
        "tune-compile-budget",
        "cli",
        "`cellbench tune --compile-budget 3`",
        "--compile-budget='3': expected FIRST,LATER",
        argv=("tune", "--model-config", "x", "--compile-budget", "3", "--out", "{tmp}/t"),
    ),
    Probe(
        "cells-missing-config",
        "cli",
        "`cellbench cells --configfile missing.yaml`",
        "config file 'missing.yaml' does not exist",
        argv=("cells", "--configfile", "missing.yaml"),
    ),
    Probe(
        "images-on-local",
        "cli",
        "`cellbench images status` (default config/local.yaml)",
        "has runtime: local, which runs no image, so there is nothing to pin",
        argv=("images", "status"),
    ),
    Probe(
        "images-bump-unknown",
        "cli",
        "`cellbench images bump rocm9.9`",
        "image 'rocm9.9' is not defined under images",
        argv=("images", "bump", "rocm9.9", "--configfile", "config/config.yaml"),
    ),
    Probe(
        "unknown-command",
        "cli",
        "`cellbench frobnicate`",
        "unknown command 'frobnicate'",
        argv=("frobnicate",),
    ),
    # --- issue 30: bad CLI values and unusable paths: one line, no traceback ---
    *[
        Probe(
            f"tune-time-budget-{name}",
            "cli",
            f"`cellbench tune --time-budget-s {value}`",
            f"--time-budget-s={shown} must be a number of seconds > 0",
            argv=(
                "tune",
                "--model-config",
                f"{MOE}/qwen3-30b-a3b.json",
                "--time-budget-s",
                value,
                "--out",
                "{tmp}/tune-out",
            ),  # fmt: skip
        )
        for name, value, shown in (
            ("negative", "-1", "-1"),
            ("zero", "0", "0"),
            ("nan", "nan", "nan"),
            ("inf", "inf", "inf"),
        )  # fmt: skip
    ],
    Probe(
        "tune-compile-workers-negative",
        "cli",
        "`cellbench tune --compile-workers -2`",
        "--compile-workers=-2 must be >= 0",
        argv=(
            "tune",
            "--model-config",
            f"{MOE}/qwen3-30b-a3b.json",
            "--compile-workers",
            "-2",
            "--out",
            "{tmp}/tune-out",
        ),  # fmt: skip
    ),
    Probe(
        "tune-out-under-a-file",
        "cli",
        "`cellbench tune --out /dev/null/tune` (a path below a file)",
        "--out /dev/null/tune: /dev/null is not a folder (expected a folder to write into)",
        argv=("tune", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--out", "/dev/null/tune"),
    ),
    Probe(
        "tune-out-is-a-file",
        "cli",
        "`cellbench tune --out FILE` (an existing file)",
        "--out {tmp}/a-file: --out itself is not a folder",
        argv=("tune", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--out", "{tmp}/a-file"),
    ),
    Probe(
        "tidy-out-dir-under-a-file",
        "cli",
        "`cellbench tidy ARCHIVED_RUN --out-dir /dev/null/t` on a damaged run",
        "an archive manifest",
        argv=(
            "tidy",
            "{tmp}/archive/embedded-cpu/20261205T000000Z-local",
            "--out-dir",
            "/dev/null/t",
        ),  # fmt: skip
        rc=1,
    ),
    Probe(
        "tidy-out-dir-unwritable",
        "cli",
        "`cellbench tidy results --out-dir /dev/null/t` (a path below a file)",
        "cellbench tidy: error: cannot write --out-dir /dev/null/t: Not a directory",
        argv=("tidy", "{tmp}/results", "--out-dir", "/dev/null/t"),
        rc=1,
    ),
    Probe(
        "tidy-not-a-folder",
        "cli",
        "`cellbench tidy FILE`",
        "{tmp}/a-file: not a folder (expected results/ or an archived run)",
        argv=("tidy", "{tmp}/a-file"),
        rc=1,
    ),
    Probe(
        "archive-list-damaged-run",
        "cli",
        "`cellbench archive list` with a run whose MANIFEST.json is cut short",
        "1 run(s) with an unreadable MANIFEST.json: embedded-cpu/20261205T000000Z-local; check "
        "them: cellbench archive verify RUN",
        argv=("archive", "list", "--archive-root", "{tmp}/archive"),
        rc=1,
    ),
    Probe(
        "archive-show-missing-run",
        "cli",
        "`cellbench archive show nosuch/run`",
        "nosuch",
        argv=("archive", "show", "nosuch/run", "--archive-root", "{tmp}/archive"),
    ),
    # --- through a real `snakemake -n`: the same messages where the user looks ---
    Probe(
        "snakemake-duplicate-key",
        "snakemake",
        "`snakemake -n` on a file with `runtime:` twice",
        "duplicate key 'runtime'",
        base="local",
        edit=lambda c: None,
        text="runtime: docker\n",
    ),
    Probe(
        "snakemake-ep-tp1",
        "snakemake",
        "`snakemake -n` with `ep: true`, `tp: 1`",
        "cells[0].ep = true with tp = 1: expert parallel needs more than one rank",
        base="local",
        edit=_set("cells", 0, "ep", True),
    ),
    Probe(
        "snakemake-grid",
        "snakemake",
        "`snakemake -n` with `serve.grid[1].isl: -1024`",
        "serve.grid[1].isl = -1024",
        edit=lambda c: c["serve"]["grid"][1].update(isl=-1024),
    ),
    Probe(
        "snakemake-image-named-report",
        "snakemake",
        "`snakemake -n` with the image named `report`",
        "images.report: results/report/ is one of the pipeline's own folders",
        base="local",
        edit=_rename_image("report"),
    ),
    Probe(
        "snakemake-repeats-float",
        "snakemake",
        "`snakemake -n` with `serve.repeats: 3.0`",
        "serve.repeats = 3.0: must be an integer, written without a decimal point (3)",
        base="local",
        edit=_set("serve", "repeats", 3.0),
    ),
    Probe(
        "snakemake-yaml-syntax",
        "snakemake",
        "`snakemake -n` on a file that is not YAML (Snakemake reads it before cellbench: "
        "its own message, without file or line; `cellbench cells --configfile F` names both)",
        "Config file is not valid JSON or YAML",
        text="runtime: local\nimages: [a\n",
    ),
]
