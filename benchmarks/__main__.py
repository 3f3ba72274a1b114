"""`python -m benchmarks run [--quick] [--json FILE]`: see benchmarks/run.py."""
import sys

from benchmarks.run import main

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "run":
        sys.exit("usage: python -m benchmarks run [--quick] [--json FILE] [--only SECTIONS]")
    main(sys.argv[2:])
