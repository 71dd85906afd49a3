import sys

from cellbench.watch.page import main

sys.exit(main())
