"""Byte-compile what the given modules import, and nothing else: after `pip install --no-compile`.

    python scripts/compile_imports.py torch torch._dynamo mlflow.server ...

pip byte-compiles every file of every package it installs (torch's thousands, MLflow's 800 MB of
dependencies): most of an install's minute. Where PYTHONDONTWRITEBYTECODE is set, Python never writes
what it compiles on import, so a file pip did not compile is compiled again in every process. This imports
the modules named (a module that fails to import is reported and skipped) and compiles each source file
then loaded: what ddplab's processes load, and no more.
"""

import importlib
import importlib.util
import os
import py_compile
import sys


def main(names: list[str]) -> int:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # an optional package's module: its files are compiled when it is used
            print(f"compile_imports: {name} not imported ({type(exc).__name__}: {exc})", file=sys.stderr)
    compiled = 0
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and not up_to_date(path):
            try:
                py_compile.compile(path, doraise=True)
                compiled += 1
            except (OSError, py_compile.PyCompileError):
                pass  # a read-only or odd file: Python compiles it on import, as before
    print(f"compile_imports: {compiled} modules compiled", file=sys.stderr)
    return 0


def up_to_date(path: str) -> bool:
    cached = importlib.util.cache_from_source(path)
    return os.path.exists(cached) and os.path.getmtime(cached) >= os.path.getmtime(path)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
