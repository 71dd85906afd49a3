"""`python -m cellbench.gsm8k ...`: the stage's command line (`evaluate.main`)."""

import sys

from cellbench.gsm8k.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
