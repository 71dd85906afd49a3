"""`python -m cellbench.tune`: see cli.py."""

import sys

from cellbench.tune.cli import main

if __name__ == "__main__":
    sys.exit(main())
