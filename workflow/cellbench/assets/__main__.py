"""`python -m cellbench.assets ...`: the stage's command line (`build.main`)."""

import sys

from cellbench.assets.build import main

if __name__ == "__main__":
    sys.exit(main())
