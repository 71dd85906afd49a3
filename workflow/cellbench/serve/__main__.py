"""`python -m cellbench.serve ...`: the stage's command line (`stage.main`)."""

import sys

from cellbench.serve.stage import main

if __name__ == "__main__":
    sys.exit(main())
