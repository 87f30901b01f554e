"""The README's first example and the guides' snippets run as written, so the docs cannot drift
from the code.

A fenced block right after an HTML comment line ``<!-- test -->`` is run: a ```python block
with this interpreter, a ```sh block with bash (``-e``, the environment's ``bin`` folder first
on PATH, so ``gnncompile`` and ``torchrun`` are the environment's). ``<!-- test: save as
NAME -->`` writes the block to NAME instead, for a later block to use. The marked blocks of one
file run in order in one empty folder, with the environment a user has: no ``GNNCOMPILE_*``
variable (the suite's conftest sets some), a cache folder of their own.

The fast tests check the markdown alone (every marked file runs something, every Python block
parses, relative links resolve); running the snippets takes seconds to a minute per file, so
that test is marked slow, and runs two files at a time.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
DOCS = [README, *GUIDES]
RESULTS = ROOT / "benchmarks" / "results" / "README.md"

#: seconds one block may take (the tuning run, about 40 s on a loaded 2-core machine, is the
#: longest)
TIMEOUT = 180

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_MARK = re.compile(r"^<!-- test(?::\s*save as (\S+))?\s*-->\n```(\w+)\n(.*?)^```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def marked_blocks(path: Path):
    """[(language, code, save_as or None)] of the marked blocks of ``path``, in order."""
    return [(lang, code, name or None) for name, lang, code in _MARK.findall(path.read_text())]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ----------------------------------------------------------------------------- the markdown
def test_the_first_example_is_the_first_python_block_and_is_run():
    text = README.read_text()
    first = next(code for lang, code in _FENCE.findall(text) if lang == "python")
    lang, code, save_as = marked_blocks(README)[0]
    assert (lang, save_as) == ("python", None) and code == first
    for needed in ("import gnncompile", "gnncompile.compile(", "gnncompile.explain(", ".backward()"):
        assert needed in code, needed


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_every_guide_is_linked_and_runs_something(guide):
    assert f"(docs/guides/{guide.name})" in README.read_text(), f"README does not link {guide.name}"
    assert any(save_as is None for _, _, save_as in marked_blocks(guide)), f"{guide.name}: no <!-- test --> block"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_python_blocks_parse(doc):
    for lang, code in _FENCE.findall(doc.read_text()):
        if lang == "python":
            ast.parse(code, filename=_rel(doc))


@pytest.mark.parametrize("doc", [*DOCS, RESULTS], ids=_rel)
def test_relative_links_resolve(doc):
    for target in _LINK.findall(doc.read_text()):
        if target.startswith(("http:", "https:", "#", "mailto:")):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{_rel(doc)} links to {target}, which does not exist"


# ----------------------------------------------------------------------------- running them
def _user_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GNNCOMPILE_")}
    env["GNNCOMPILE_CACHE_DIR"] = str(tmp_path / "cache")  # no profile of the user's, none left behind
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)  # gnncompile as installed, not the test run's paths
    return env


def _run_doc(doc: Path, folder: Path) -> str:
    """Runs ``doc``'s marked blocks in order in ``folder``: '' when all exit 0, else what failed."""
    folder.mkdir(parents=True)
    blocks = marked_blocks(doc)
    if not blocks:
        return f"{_rel(doc)} has no <!-- test --> block"
    env = _user_env(folder)
    for i, (lang, code, save_as) in enumerate(blocks):
        if save_as is not None:
            (folder / save_as).write_text(code)
            continue
        if lang == "python":
            script = folder / f"snippet_{i}.py"
            cmd = [sys.executable, str(script)]
        elif lang in ("sh", "bash"):
            script = folder / f"snippet_{i}.sh"
            cmd = ["bash", "-e", str(script)]
        else:
            return f"{_rel(doc)}: a marked block in {lang!r}; only python and sh run"
        script.write_text(code)
        try:
            r = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired as e:  # its partial output is bytes, even with text=True
            out = [(s or b"").decode(errors="replace")[-2000:] for s in (e.stdout, e.stderr)]
            return f"{_rel(doc)}: marked block {i} ({lang}) ran over {TIMEOUT} s\n{out[0]}\n{out[1]}"
        if r.returncode != 0:
            return (f"{_rel(doc)}: marked block {i} ({lang}) exited with {r.returncode}\n"
                    f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")
    return ""


#: documents whose snippets the suite does not run, and the tests that run the same paths: their
#: ``gnncompile`` command lines are parsed instead (test_command_lines_parse)
NOT_RUN = {"tuning.md": "tests/tuner/test_tuner.py::test_cli_tune_writes_profile_that_compile_uses "
                        "(a tuning run, then compile with its profile)"}


def _command_lines(doc: Path):
    """The ``gnncompile ...`` command lines of ``doc``'s marked sh blocks (continuations joined)."""
    for lang, code, save_as in marked_blocks(doc):
        if lang in ("sh", "bash") and save_as is None:
            for line in code.replace("\\\n", " ").splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("gnncompile "):
                    yield line


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_command_lines_parse(doc, capsys):
    """Every documented ``gnncompile`` command line is one the command line accepts."""
    import shlex

    from gnncompile import cli

    for line in _command_lines(doc):
        try:
            cli.parser().parse_args(shlex.split(line)[1:])
        except SystemExit:
            pytest.fail(f"{_rel(doc)}: `{line}` is refused: {capsys.readouterr().err.strip()}")


@pytest.mark.slow
def test_marked_snippets_run(tmp_path):
    """Every document's marked blocks (but NOT_RUN's), two documents at a time (a snippet is
    mostly one busy thread: importing, tracing, compiling), the longest first."""
    from concurrent.futures import ThreadPoolExecutor

    docs = [d for d in DOCS if d.name not in NOT_RUN]
    order = sorted(docs, key=lambda d: -sum(len(code) for _, code, _ in marked_blocks(d)))
    with ThreadPoolExecutor(2) as pool:
        failed = [f for f in pool.map(lambda d: _run_doc(d, tmp_path / d.stem), order) if f]
    assert not failed, "\n\n".join(failed)
