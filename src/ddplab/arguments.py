"""The kinds of value a command-line option takes (argparse `type=`): the commands' and the executors' options
alike, so a bad value is argparse's one line naming the option. Torch-free."""

import argparse
import math


def whole_list(text: str) -> list[int]:
    """A comma-separated list of whole numbers >= 1 (1,2,4,8)."""
    parts = [part.strip() for part in text.split(",")]
    if not parts or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers >= 1")
    return sorted({int(part) for part in parts})


def positive_whole(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


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
