"""`python -m cellbench.results FILE...`: check result files by hand (see loaders.main)."""

import sys

from cellbench.results.loaders import main

if __name__ == "__main__":
    sys.exit(main())
