"""`python -m cellbench.gates ...`: the stage's command line (`check.main`)."""

import sys

from cellbench.gates.check import main

if __name__ == "__main__":
    sys.exit(main())
