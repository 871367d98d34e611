"""`python -m quorumstore.cli`: how `cluster` starts its children and tests start servers."""

import sys

from quorumstore.cli import main

sys.exit(main())
