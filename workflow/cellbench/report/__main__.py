"""`python -m cellbench.report ...`: the stage's command line (`build.main`)."""

import sys

from cellbench.report.build import main

if __name__ == "__main__":
    sys.exit(main())
