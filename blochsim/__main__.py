"""`python -m blochsim ...`: the command line (blochsim.cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
