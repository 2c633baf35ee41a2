"""The kinds of value a command-line option takes (argparse `type=`): the commands' and the executors' options
alike, so a bad value is argparse's one line naming the option. Torch-free."""

import argparse
import math
import re

from ddplab.io.borders import shown

MOST = 2**31 - 1  # the largest count an option takes (GPUs, nodes, batch, processes): a 400-digit one is a typo


def whole_list(text: str) -> list[int]:
    """A comma-separated list of whole numbers >= 1 (1,2,4,8)."""
    parts = [part.strip() for part in text.split(",")]
    if not parts or not all(part.isdigit() and 1 <= int(part) <= MOST for part in parts):
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not a comma-separated list of whole numbers from 1 to {MOST}"
        )
    return sorted({int(part) for part in parts})


def given(text: str) -> str:
    """A name or a value that must be there (a link's name): an empty one (an unset shell variable) is refused,
    never read as the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty value (an unset shell variable?): give one, or leave it out")
    return text


def positive_whole(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MOST:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a whole number from 1 to {MOST}")
    return int(text)


ENDPOINT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[\w.\-]+):(\d+)")


def endpoint_parts(text: str, *, nodes: int = 1) -> tuple[str, int]:
    """'host:port' (an IPv6 host in brackets) -> (host, port), for a group of `nodes` nodes; ValueError saying
    what is wrong. The one rule for a rendezvous endpoint, wherever one is given (train, plan --measure)."""
    found = ENDPOINT.fullmatch(text.strip())
    if not found:
        raise ValueError("expected host:port, e.g. 10.0.0.1:29500 (an IPv6 address in brackets: [fd00::1]:29500)")
    host, port = found.group(1), int(found.group(2))
    if port > 65535:
        raise ValueError("a port is 1 to 65535")
    if port == 0 and nodes > 1:
        raise ValueError(
            "port 0 picks a free port on each node by itself, so the nodes would never meet: give one free "
            "port, the same on every node, e.g. 29500"
        )
    return host.strip("[]"), port


def rdzv_endpoint(text: str) -> str:
    """`--rdzv-endpoint`: host:port (the port checked against the node count where the command knows it)."""
    try:
        endpoint_parts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{shown(text)}: {exc}") from None
    return text.strip()


AUTO = "auto"  # --parallel auto: one point per GPU on a CUDA machine, one at a time on a CPU (sweep/slots.py)


def parallel_points(text: str) -> int | str:
    """`--parallel`: a whole number >= 1, or auto."""
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of points to run at once (a whole number >= 1) or auto"
        )
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


RATE = re.compile(r"(\d+(?:\.\d+)?)\s*(k|m|g)?(bit|bps)?", re.I)
RATE_UNITS = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}


def link_rate(text: str | None) -> float | None:
    """A link's rate in bits per second: '200mbit', '1gbit', '1.5g', '500k' (and tc's own spelling, 125000Kbps in
    bytes); 'none', 'unshaped', 'off' or None: no rate. An empty value is refused, not read as none (`shape ''`, a
    shell variable left unset, must not unshape every link). A ValueError says what is wrong."""
    if text is None or text.strip().lower() in ("none", "unshaped", "off"):
        return None
    match = RATE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"link rate {text!r}: expected e.g. 100mbit, 1gbit, 2.5gbit or none")
    unit = (match.group(2) or "").lower() or None
    rate = float(match.group(1)) * RATE_UNITS[unit]
    if match.group(3) and match.group(3).lower() == "bps":
        rate *= 8  # bytes per second, as tc spells it
    if not 8e3 <= rate <= 1e11:
        raise ValueError(f"link rate {text!r}: must be between 8kbit and 100gbit")
    return rate
