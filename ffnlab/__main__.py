"""`python -m ffnlab ARGS`: the `ffnlab` command, for an environment whose scripts folder is not on the PATH."""

import sys

from ffnlab.cli import main

sys.exit(main())
