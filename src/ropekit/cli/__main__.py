"""``python -m ropekit.cli``: the same command line as ``ropekit``."""

from ropekit.cli import main

if __name__ == "__main__":
    main()
