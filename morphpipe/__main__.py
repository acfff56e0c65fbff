"""`python -m morphpipe`: the command line (what torchrun's `-m morphpipe` starts on every rank)."""
import sys

from morphpipe.commands.cli import main

sys.exit(main())
