"""The README is executable documentation: its bash and python blocks run, in order, in a scratch copy.

::

    tmp_path/
      repo/            this checkout's files (git ls-files: tracked and not ignored), commands run here
        .venv -> the environment running the tests (``haloflow``, ``torchrun`` on PATH from its bin/)
      shared/data -> the real data folder (the README reads ../shared/data)

``PYTHONPATH`` is the scratch repo, so its code is what runs. The markup that skips a block or sizes it down is in
``tests/readme_blocks.py``; a failure names the README line, the command and the end of its output.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.readme_blocks import Block, bash_commands, parse_blocks

README = REPO / "README.md"
COMMAND_TIMEOUT_S = 300  # one command or python block; the whole README ran in 3 min 45 s on 2 shared cores
TAIL = 3000  # characters of a failed command's output in the report

# One interpreter for every python block: a request per block on stdin, a reply per block on the original
# stdout; the blocks' own output (fd 1 and 2) goes to the log file.
_DRIVER = r"""
import json, linecache, os, signal, sys, traceback
sys.stdout.flush()
reply = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
def _timeout(signum, frame):
    raise TimeoutError("the block ran past its timeout")
signal.signal(signal.SIGALRM, _timeout)
namespace, readme = {"__name__": "__main__"}, []
for request in sys.stdin:
    block = json.loads(request)
    source = "\n" * (block["line"] - 1) + block["source"]  # so that a traceback names the README's own lines
    lines = source.splitlines(True)
    readme.extend([""] * (len(lines) - len(readme)))
    readme[block["line"] - 1:len(lines)] = lines[block["line"] - 1:]
    linecache.cache["README.md"] = (None, None, readme, "README.md")  # ... and shows them
    error = None
    signal.alarm(block["timeout"])
    try:
        exec(compile(source, "README.md", "exec"), namespace)
    except BaseException:
        error = traceback.format_exc()
    finally:
        signal.alarm(0)
    sys.stdout.flush(); sys.stderr.flush()
    reply.write(json.dumps({"error": error}) + "\n")
"""


def _tail(text: str) -> str:
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the command's own children too (torchrun's ranks)
    except ProcessLookupError:
        pass


def run_bash(command: str, cwd: Path, env: dict, timeout: float) -> tuple[int | None, str]:
    """(exit status, None when it timed out; stdout + stderr) of ``bash -e -c command`` in its own session."""
    proc = subprocess.Popen(["bash", "-e", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return None, out


class PythonSession:
    """One interpreter in which the README's python blocks run in order, sharing one namespace."""

    def __init__(self, cwd: Path, env: dict, log: Path):
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen([sys.executable, "-c", _DRIVER], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=f, text=True, start_new_session=True)

    def run(self, block: Block, timeout: int) -> str | None:
        """None when the block ran, else its traceback and output."""
        start = self.log.stat().st_size
        self.proc.stdin.write(json.dumps({"line": block.line, "source": block.text, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout + 60)  # + 60: the alarm fires first
        reply = self.proc.stdout.readline() if ready else ""
        output = self.log.read_text()[start:]
        if not reply:
            _kill_group(self.proc)
            return f"the interpreter {'hung' if not ready else 'died'}; its output:\n{_tail(output)}"
        error = json.loads(reply)["error"]
        return None if error is None else f"{_tail(output).rstrip()}\n{error}".lstrip()

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            self.proc.wait()


@pytest.fixture
def scratch(tmp_path, shared_data) -> tuple[Path, dict]:
    """A copy of this checkout as the README's user has it: (repo folder, environment for its commands)."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "haloflow").is_file():
        pytest.skip(f"no haloflow command in {venv / 'bin'} (install the project: bash scripts/setup.sh)")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout, so its files cannot be listed: {listed.stderr.strip()}")
    repo = tmp_path / "repo"
    for rel in filter(None, listed.stdout.split("\0")):
        src, dst = REPO / rel, repo / rel
        if src.is_file():  # a tracked file deleted in the work tree is not there to copy
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)  # with its mtime, which numba's cache index checks
    # numba's compiled kernels (ignored by git, so not listed): without them every kernel the README's commands
    # use compiles again in the copy, about half the test's time; an entry whose source differs is not used
    for cached in (REPO / "haloflow").rglob("__pycache__/*.nb[ic]"):
        dst = repo / cached.relative_to(REPO)
        if dst.parent.parent.is_dir():
            dst.parent.mkdir(exist_ok=True)
            shutil.copy2(cached, dst)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(shared_data)
    (repo / ".venv").symlink_to(venv)
    env = {k: v for k, v in os.environ.items() if k not in ("HALOFLOW_DATA", "PYTHONPATH")}
    env.update(PATH=f"{repo / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(repo),
               PYTHONUNBUFFERED="1")
    return repo, env


def test_readme_markup_applies():
    """Not slow: every piece of markup is just above a block, and every sub still matches its block's text."""
    blocks = parse_blocks(README.read_text(), root=REPO)
    assert [b.lang for b in blocks if b.skip is None], "the README has no runnable blocks"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # each command has its own COMMAND_TIMEOUT_S; this bounds the sum on a loaded machine
def test_readme_blocks_run(scratch, tmp_path):
    """Every bash command and python block of the README, in order; ``-s`` shows the seconds of each."""
    repo, env = scratch
    python = PythonSession(repo, env, tmp_path / "python.log")
    try:
        for block in parse_blocks(README.read_text(), root=REPO):
            if block.skip is not None:
                continue
            if block.lang == "python":
                t0 = time.perf_counter()
                error = python.run(block, COMMAND_TIMEOUT_S)
                if error is not None:
                    pytest.fail(f"README.md:{block.line}: the python block starting here failed:\n{error}")
                print(f"{time.perf_counter() - t0:6.1f} s  README.md:{block.line} python block", flush=True)
                continue
            for line, command in bash_commands(block):
                if (test := block.runs_elsewhere(line)) is not None:
                    print(f"   -    README.md:{line} {command.splitlines()[0]}  (run by {test})", flush=True)
                    continue
                t0 = time.perf_counter()
                status, output = run_bash(command, repo, env, COMMAND_TIMEOUT_S)
                if status != 0:
                    what = f"ran past {COMMAND_TIMEOUT_S} s" if status is None else f"exited with status {status}"
                    pytest.fail(f"README.md:{line}: {what}: {command}\n{_tail(output)}")
                print(f"{time.perf_counter() - t0:6.1f} s  README.md:{line} {command.splitlines()[0]}", flush=True)
    finally:
        python.close()


# ------------------------------------------------------------------------------------------------ the markup
TEXT = """# Title

<!-- readme-test: skip (needs a GPU) -->
```bash
nvidia-smi
```

```
a layout picture, not code
```

<!-- readme-test: sub "--epochs 200" "--epochs 3" -->
<!-- readme-test: sub "runs/a" "runs/b" -->
```bash
# a comment, not a command
haloflow train gcn --epochs 200 --out runs/a \\
    --log-jsonl runs/a.jsonl

haloflow inspect runs/a    # a trailing comment stays
```

```python
x = 1
```
"""


def test_blocks_are_the_bash_and_python_ones_in_order_with_their_markup():
    skipped, bash, python = parse_blocks(TEXT)
    assert (skipped.lang, skipped.line, skipped.skip) == ("bash", 5, "needs a GPU")
    assert (bash.lang, bash.line, bash.skip) == ("bash", 15, None)
    assert "--epochs 3 --out runs/b" in bash.text and "runs/a" not in bash.text  # every occurrence, pairs in order
    assert (python.lang, python.line, python.text) == ("python", 23, "x = 1\n")


def test_bash_commands_join_continued_lines_and_leave_out_comments():
    assert bash_commands(parse_blocks(TEXT)[1]) == [
        (16, "haloflow train gcn --epochs 3 --out runs/b \\\n    --log-jsonl runs/b.jsonl"),
        (19, "haloflow inspect runs/b    # a trailing comment stays"),
    ]


@pytest.mark.parametrize("markup, message", [
    ('sub "--epochs 9" "--epochs 3"', r"README.md:1: sub '--epochs 9' does not occur in the block at line 3"),
    ('sub "--epochs 200"', r"README.md:1: sub takes pairs"),
    ("only (GPU)", r"README.md:1: unknown readme-test markup 'only \(GPU\)'"),
    ("skip ( )", r"README.md:1: skip needs a reason"),
    ('sub "--epochs 200 "--epochs 3"', r"README.md:1: .* No closing quotation"),
])
def test_markup_that_cannot_apply_names_its_line(markup, message):
    with pytest.raises(ValueError, match=message):
        parse_blocks(f"<!-- readme-test: {markup} -->\n```bash\nhaloflow --epochs 200\n```\n")


def test_elsewhere_leaves_out_the_commands_a_named_test_runs():
    text = ('<!-- readme-test: elsewhere "haloflow bench cache" tests/cli/test_bench.py -->\n'
            "```bash\nhaloflow bench cache --rows 9\nhaloflow bench gcn\n```\n")
    (block,) = parse_blocks(text, root=REPO)
    assert [block.runs_elsewhere(line) for line, _ in bash_commands(block)] == ["tests/cli/test_bench.py", None]


@pytest.mark.parametrize("markup, message", [
    ('elsewhere "haloflow nope" tests/cli/test_bench.py', r"README.md:1: elsewhere 'haloflow nope': no command"),
    ('elsewhere "haloflow bench cache" tests/no_such.py', r"README.md:1: elsewhere names tests/no_such.py, which "
                                                          r"does not exist"),
    ('elsewhere "haloflow bench cache" tests/host/test_openmp.py', r"line 3, but it never mentions 'cache'"),
    ('elsewhere "haloflow bench cache" tests/bench/test_contention.py', r"never mentions 'cache', '--no-such-flag'"),
    ('elsewhere "haloflow bench cache"', r"README.md:1: elsewhere takes"),
])
def test_elsewhere_that_cannot_apply_names_its_line(markup, message):
    with pytest.raises(ValueError, match=message):
        parse_blocks(f"<!-- readme-test: {markup} -->\n```bash\nhaloflow bench cache --no-such-flag 1\n```\n", root=REPO)


@pytest.mark.parametrize("text, message", [
    ("<!-- readme-test: skip (x) -->\n\n```bash\nls\n```\n", r"README.md:1: .* just above .* line 2 is ''"),
    ("<!-- readme-test: skip (x) -->\n```text\nls\n```\n", r"README.md:1: .* above a ```text block, which is not run"),
    ("<!-- readme-test: skip (x) -->\n", r"README.md:1: .* no code block below"),
    ("```bash\nls\n", r"README.md:1: code block never closed"),
])
def test_markup_away_from_a_runnable_block_names_its_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_blocks(text)
