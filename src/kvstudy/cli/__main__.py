"""``python -m kvstudy.cli`` (how Ray's workers start ``kvstudy run-block``)."""

import sys

from kvstudy.cli import main

sys.exit(main())
