"""``python -m gdn_verify``: the same commands as ``gdn-verify`` and ``cli.py``."""

import sys

from gdn_verify._cli import run

if __name__ == "__main__":
    sys.exit(run())
