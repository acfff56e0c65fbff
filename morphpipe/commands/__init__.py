"""The `morphpipe` command line: one module per sub-command, on top of every library package.

`cli.py` is the entry point; `workload.py` holds the workload flags and settings `tune` and `train` share.
"""
