import sys

from proxyinfra.cli import main

sys.exit(main())
