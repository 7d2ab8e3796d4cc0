"""`python -m memrl` is the `memrl` command."""

from memrl.app.cli.main import main

main()
