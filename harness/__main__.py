"""``python -m harness``: the kvmatrix command line."""
import sys

from harness.cli import main

sys.exit(main())
