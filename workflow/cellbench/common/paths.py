"""Where the package, the workflow folder, its schemas and the repository lie (one place, so a
module's depth in the package does not decide the paths it reads)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # workflow/cellbench
DATA_DIR = PACKAGE_DIR / "data"
WORKFLOW_DIR = PACKAGE_DIR.parent  # workflow/
SCHEMA_DIR = WORKFLOW_DIR / "schemas"
REPO_DIR = WORKFLOW_DIR.parent
