"""`python -m cellbench.configs ...`: the stage's command line (`collect.main`)."""

import sys

from cellbench.configs.collect import main

if __name__ == "__main__":
    sys.exit(main())
