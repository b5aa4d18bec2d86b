"""The documented install: a virtualenv (numpy from the system) and one
offline pip command, then `import loom` and an extract from that
environment."""

import os
import subprocess
import sys
import textwrap

from conftest import REPO, STORIES

PY_DIR = os.environ.get("LOOM_PYTHON_DIR", os.path.join(REPO, "build", "python"))


def test_pip_install_into_a_virtualenv(tmp_path):
    assert PY_DIR and os.path.isfile(os.path.join(PY_DIR, "pyproject.toml")), PY_DIR
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index", PY_DIR],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    script = textwrap.dedent("""
        import sys, loom
        assert loom.__file__.startswith(sys.prefix), loom.__file__
        m = loom.Model(%r)
        r = m.extract(["Once upon a time"], "blocks.1.hook_resid_post")
        print(loom.__file__, r["blocks.1.hook_resid_post"].shape)
    """ % STORIES)
    p = subprocess.run([str(py), "-c", script], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "(1, 64)" in p.stdout
