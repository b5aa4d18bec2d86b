"""The examples of docs/python.md run as written, and say what they give.

Every ```python block of the page is executed in order, in one namespace,
in a temporary directory holding the repository's models/ and tests/data/
(so the page's relative paths work). The page's conventions (stated on it):
  - `# $ loom ARGS` on a line of its own: a command the reader runs first;
    the test runs it (with the built loom) before the block;
  - `EXPR  # ==> VALUE`: VALUE (a Python literal) is what EXPR gives; the
    test checks it (a float to the decimals written);
  - a block whose first line is `# not run: REASON` needs what a test
    machine lacks; it is skipped, and listed in the test's report.
"""

import ast
import json
import os
import pathlib
import re
import shlex

import pytest

from conftest import MODELS, REPO, STORIES, run_loom

DOC = os.path.join(REPO, "docs", "python.md")
WIKI = os.path.join(REPO, "tests", "data", "wikitext2", "wiki.test.raw.first16000chars.txt")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
CHECK = re.compile(r"^(?P<expr>\S.*?)\s+# ==> (?P<want>.+)$")
COMMAND = re.compile(r"^# \$ (?P<command>loom .*)$", re.M)


def doc_blocks():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    for m in BLOCK.finditer(text):
        yield text.count("\n", 0, m.start(1)) + 1, m.group(1)


def check(value, want_text, line):
    """`value` is what `# ==> want_text` on docs/python.md:line says."""
    want = ast.literal_eval(want_text)
    if isinstance(want, float):
        decimals = len(want_text.split(".")[1]) if "." in want_text else 0
        assert round(float(value), decimals) == want, "docs/python.md:%d: %r, not %s" % (
            line, value, want_text)
        return
    if isinstance(want, tuple) and hasattr(value, "shape") and not isinstance(value, tuple):
        value = value.shape
    assert value == want, "docs/python.md:%d: %r, not %s" % (line, value, want_text)


def with_checks(code, first_line):
    """The block with each `EXPR  # ==> VALUE` line turned into a check."""
    out = []
    for i, line in enumerate(code.splitlines()):
        m = CHECK.match(line)
        if m:
            line = "_doc_check((%s), %r, %d)" % (m.group("expr"), m.group("want"), first_line + i)
        out.append(line)
    # Blank lines first: tracebacks give the page's line numbers.
    return "\n" * (first_line - 1) + "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    work = tmp_path_factory.mktemp("docs")
    os.symlink(MODELS, work / "models")
    (work / "tests").mkdir()
    os.symlink(os.path.join(REPO, "tests", "data"), work / "tests" / "data")
    namespace = {"__name__": "docs_python_md", "_doc_check": check}
    ran, skipped, checks = [], [], 0
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for line, code in doc_blocks():
            if code.startswith("# not run:"):
                skipped.append("docs/python.md:%d %s" % (line, code.splitlines()[0]))
                continue
            for m in COMMAND.finditer(code):
                run_loom(*shlex.split(m.group("command"))[1:])
            checks += sum(1 for l in code.splitlines() if CHECK.match(l))
            exec(compile(with_checks(code, line), DOC, "exec"), namespace)
            ran.append(line)
    finally:
        os.chdir(cwd)
    return namespace, ran, skipped, checks


def test_the_python_examples_of_the_docs_run(executed):
    _, ran, skipped, checks = executed
    assert len(ran) >= 4, "docs/python.md has only %d python blocks" % len(ran)
    assert checks >= 10, "only %d values are checked" % checks
    # Honest and minimal: no example is left out today.
    assert skipped == [], skipped


def test_the_documented_perplexity_call_reproduces_the_cli(executed, model):
    namespace = executed[0]
    # The page's call gives the CLI's figure (README, tests/perplexity_test.cc:
    # 111.528 with --ctx 256 --stride 128), checked on the page to 2
    # decimals; here the same call and `loom perplexity` over the first
    # windows of the same file give the same JSON, bit for bit.
    assert round(namespace["ppl"], 3) == 111.528
    cli = json.loads(run_loom("perplexity", "--model", STORIES, "--text", WIKI, "--ctx", "256",
                              "--max-windows", "6", "--json", "--quiet").stdout)
    got = model.perplexity(pathlib.Path(WIKI), ctx=256, max_windows=6)
    for key in ("seconds", "tokens_per_second"):
        got.pop(key), cli.pop(key)
    assert got == cli and got["windows"] == 6
    # The file has CRLF line ends: text mode drops the '\r' (another text,
    # another perplexity); bytes and newline="" keep them, as the page says.
    with open(WIKI, "rb") as f:
        raw = f.read()
    assert b"\r\n" in raw
    with open(WIKI, encoding="utf-8", newline="") as f:
        assert f.read().encode("utf-8") == raw
    with open(WIKI, encoding="utf-8") as f:
        text_mode = f.read()
    assert "\r" not in text_mode
    assert model.perplexity(raw, ctx=256, max_windows=6)["nll_sum"] == cli["nll_sum"]
    assert model.perplexity(text_mode, ctx=256, max_windows=6)["nll_sum"] != cli["nll_sum"]
