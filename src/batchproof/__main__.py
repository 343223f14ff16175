"""`python -m batchproof` runs the same CLI as the `batchproof` script."""

from batchproof.cli import main

raise SystemExit(main())
