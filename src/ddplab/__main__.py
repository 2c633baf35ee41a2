"""`python -m ddplab` and the `ddplab` command.

The entry point imports the CLI inside its own try, so a Ctrl-C that arrives while Python
is still importing is one line too.
"""

import sys


def run() -> int:
    try:
        from ddplab.cli import main

        return main(whole_process=True)
    except KeyboardInterrupt:
        from ddplab.errors import Interrupted

        print("ddplab: interrupted", file=sys.stderr)
        return Interrupted.exit_code


if __name__ == "__main__":
    sys.exit(run())
