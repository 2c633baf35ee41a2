"""A run folder's file names are a file format: written once, in ddplab/rundir/runfiles.py."""

import re

from ddplab.rundir import runfiles

from support.settings import REPO


def test_no_run_folder_file_name_is_written_as_a_literal_outside_its_module():
    # "tensorboard" is also the name of an output setting (a config key), so it is left out of the search.
    names = [v for k, v in vars(runfiles).items() if k.isupper() and v != runfiles.TENSORBOARD]
    literal = re.compile(r"""["'](""" + "|".join(map(re.escape, names)) + r""")["']""")
    found = []
    for path in [*(REPO / "src").rglob("*.py"), *(REPO / "benchmarks").glob("*.py"), *(REPO / "scripts").glob("*.py")]:
        if path.name == "runfiles.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for match in literal.finditer(code):
                if not code.lstrip().startswith(("'", '"')):  # prose in a docstring may name a file
                    found.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)}")
    assert not found, found
