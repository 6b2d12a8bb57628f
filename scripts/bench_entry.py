"""Entry script for msrun (which starts ``python <script> args``): runs ``eagle-ms <args>``.

Used by scripts/msrun_bench.sh; equivalent to the ``eagle-ms`` console script.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eagle_ms.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
