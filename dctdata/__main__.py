"""`python -m dctdata` is the console script."""

import sys

from dctdata.cli import main

sys.exit(main())
