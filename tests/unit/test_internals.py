"""Every private API ddplab relies on (ddplab.internals): each check passes on the installed CPython, torch and
numpy, or this test fails naming the API, before anything that relies on it misbehaves."""

import pytest

from ddplab import internals

SLOW = {"torch._dynamo.eval_frame.OptimizedModule._orig_mod": "imports torch._dynamo: seconds"}


@pytest.mark.parametrize(
    "api",
    [
        pytest.param(a, id=a.name, marks=[pytest.mark.slow(why=SLOW[a.name])] if a.name in SLOW else [])
        for a in internals.PRIVATE
    ],
)
def test_each_private_api_is_as_ddplab_relies_on_it(api):
    try:
        api.check()
    except Exception as exc:  # noqa: BLE001 (the test's message names the API and what relied on it)
        pytest.fail(f"{api.name} changed ({type(exc).__name__}: {exc}); relied on for {api.used_for}; checked on "
                    f"{api.checked_on}")  # fmt: skip


def test_a_changed_api_fails_its_check_by_name():
    gone = internals._callable("runpy._no_such_runner")
    with pytest.raises(AttributeError):
        gone()
    renamed = internals._callable("runpy._run_module_as_main", "mod_name", "no_such_parameter")
    with pytest.raises(AssertionError, match=r"runpy._run_module_as_main takes .*, not \['mod_name', 'no_such_param"):
        renamed()


def test_a_patch_is_undone_after_its_block_and_a_missing_one_does_nothing():
    class Owner:
        @staticmethod
        def start():
            return "original"

    with internals.wrapped(Owner, "start", lambda f: lambda: "wrapped " + f()) as done:
        assert done and Owner.start() == "wrapped original"
    assert Owner.start() == "original"
    with internals.wrapped(Owner, "absent", lambda f: f) as done:
        assert not done and not hasattr(Owner, "absent")


def test_every_private_name_used_in_the_source_is_listed():
    """A private attribute of another project's module read anywhere in src/ddplab goes through internals."""
    import re
    from pathlib import Path

    src = Path(internals.__file__).parent
    pattern = re.compile(r"\b(subprocess|runpy|atexit|threading|mp_context|popen_spawn_posix|registry|api)\._[a-z]")
    found = [
        f"{path.relative_to(src)}:{n}"
        for path in sorted(src.rglob("*.py"))
        if path.name != "internals.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line.split("#")[0])
    ]
    assert not found, found
