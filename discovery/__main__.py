"""`python -m discovery serve ...` (see discovery/cli.py)."""

import sys

from discovery.cli import main

sys.exit(main())
