"""`python -m aotrt ...`: the command line (aotrt/cli.py)."""

import sys

from aotrt.cli import main

sys.exit(main())
