"""`python -m haloflow ...` (also what `torchrun -m haloflow ...` runs on every rank)."""

from haloflow.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
