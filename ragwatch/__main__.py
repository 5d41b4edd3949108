"""``python -m ragwatch`` = the ``ragwatch`` console script."""

import sys

from ragwatch.cli import main

if __name__ == "__main__":
    sys.exit(main())
