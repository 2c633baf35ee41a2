# Sourced by bootstrap.sh and test.sh. `install ARGS...`: pip install ARGS into .venv, through uv where uv can be
# had (its downloads and unpacking run in parallel: the test suite's packages in 7 s instead of pip's 48 on the
# 2-core machine, both from a warm cache), else pip itself. Neither byte-compiles: compile_imports.py compiles
# what ddplab's processes import, and no more.
install() {
  if [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q --no-compile uv >/dev/null 2>&1; then
    if .venv/bin/uv pip install -q --python .venv/bin/python "$@"; then
      return 0
    fi
    echo "install: uv could not install $*; trying pip" >&2
  fi
  .venv/bin/python -m pip install -q --no-compile "$@"
}
