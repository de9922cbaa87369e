"""``python -m kvstudy.cli`` (how Ray's workers start ``kvstudy run-block``)."""

from kvstudy.cli import main

raise SystemExit(main())
