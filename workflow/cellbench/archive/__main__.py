"""`python -m cellbench.archive ...`: the stage's command line (`write.main`)."""

import sys

from cellbench.archive.write import main

if __name__ == "__main__":
    sys.exit(main())
