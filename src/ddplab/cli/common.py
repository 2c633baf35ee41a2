"""What every command's parsing and checks share: ddplab's parser (one line for a usage error, no
abbreviated flags), a command's modes that exclude each other, and options a mode does nothing with."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import typing
from typing import Any

from ddplab import internals
from ddplab.errors import ConfigError


class Parser(argparse.ArgumentParser):
    """ddplab's argument parser: a usage error is one line with a pointer to --help (never the usage
    screen), and flags are never abbreviated: `--train.epoch` is an error that names
    `--train.epochs`, not a silent match. Subcommands inherit it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"ddplab: error: {message}{self.suggestion(message)} (see {self.prog} --help)\n")

    def suggestion(self, message: str) -> str:
        """'; did you mean --x?' for the first unknown flag of an 'unrecognized arguments' message."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        unknown = next((w.split("=")[0] for w in message.split(":", 1)[1].split() if w.startswith("--")), None)
        if unknown is None:
            return ""
        owners = self.all_flags()
        if unknown in owners:  # a flag of another command: the typo is the command's, not the flag's
            return f"; {unknown} is an option of {' and '.join(owners[unknown])}"
        named = next((w for w in self.given if not w.startswith("-")), None)  # the command, as main() finds it
        own = [f for f, progs in owners.items() if any(p.split()[1:2] == [named] for p in progs)] or list(owners)
        close = difflib.get_close_matches(unknown, own, n=1)
        if close:
            return f"; did you mean {close[0]}?"
        other = difflib.get_close_matches(unknown, list(owners), n=1)  # another command's, said as such
        return f"; did you mean {other[0]} (an option of {' and '.join(owners[other[0]])})?" if other else ""

    given: tuple[str, ...] = ()  # the words of the command line being parsed (which command it names)

    def parse_args(self, args=None, namespace=None):
        Parser.given = tuple(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def all_flags(self) -> dict[str, list[str]]:
        """Each long flag of this parser and its subcommands' (argparse reports a subcommand's unknown
        flags here), with the commands that have it."""
        flags: dict[str, list[str]] = {f: [self.prog] for f in self._option_string_actions if f.startswith("--")}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for p in action.choices.values():
                    if isinstance(p, Parser):
                        for flag, progs in p.all_flags().items():
                            flags.setdefault(flag, []).extend(progs)
        return flags


def one_mode(command: str, modes: list[tuple[str, bool]]) -> None:
    """Modes of a command that exclude each other: two given is one line, never one of them dropped in silence."""
    given = [name for name, on in modes if on]
    if len(given) > 1:
        raise ConfigError(
            f"ddplab {command}: {given[0]} and {given[1]} cannot go together (each is a mode of its own): give one"
        )


def given_options(args: argparse.Namespace) -> list[str]:
    """The options of `args`' command set to something other than their default: what the user asked for."""
    parser = getattr(args, "command_parser", None)
    return [
        a.option_strings[-1]
        for a in (internals.parser_actions(parser) if parser else [])
        if a.option_strings and a.default is not argparse.SUPPRESS and getattr(args, a.dest, a.default) != a.default
    ]


def used_by(command: str, mode: str, args: argparse.Namespace, uses: tuple[str, ...]) -> None:
    """Options given that `mode` does nothing with: one line, never dropped in silence."""
    unused = [o for o in given_options(args) if o not in (*uses, "--debug")]
    if unused:
        them = "it" if len(unused) == 1 else "them"
        raise ConfigError(
            f"ddplab {command}: {', '.join(unused)} {'does' if len(unused) == 1 else 'do'} nothing {mode}: "
            f"leave {them} out"
        )


def quiet_native_logs(debug: bool) -> None:
    """Before torch loads, which reads it once (a warm child's torch has: then at once): c10d's socket logs
    across nodes (a reverse lookup that fails, each retry of a connect to a host not up yet) would bury the
    one line ddplab says for each network fault. --debug keeps them."""
    if not debug:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        if "torch" in sys.modules:  # a warm child: its torch loaded in the server, before this was said
            from ddplab import compat

            compat.set_cpp_log_level(os.environ["TORCH_CPP_LOG_LEVEL"])
