"""`python -m memrl` is the `memrl` command."""

from memrl.app.cli.entry import main

main()
