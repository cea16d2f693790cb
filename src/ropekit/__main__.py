"""``python -m ropekit``: the same command line as ``ropekit``."""

import sys

try:
    from ropekit.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line is still importing: the same one line as later
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None

if __name__ == "__main__":
    main()
