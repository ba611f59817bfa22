"""`python -m corral.build_native [build [-v] | status]`: compile the core (see corral.native)."""

from corral.native import main

if __name__ == "__main__":
    raise SystemExit(main())
