"""The `torchlint` command's entry point (the console script and ``python -m torchlint``)."""
import sys


def main():
    from .cli import main as cli_main

    argv = sys.argv[1:]
    if argv and argv[0] in ("rule", "rules", "lsp", "confirm", "--help", "-h", "--version", "-V"):
        cli_main()
        return
    # A check is the last thing this process does. The collector stays off for it (the lint
    # breaks its own cycles and collects where it matters: see ``torchlint/gcpolicy.py``), and
    # what it leaves is frozen on the way out: the collection at interpreter exit would
    # otherwise walk every result and the decoded cache (10-20 ms of a warm run).
    import gc

    gc.disable()
    try:
        cli_main()
    finally:
        gc.freeze()
