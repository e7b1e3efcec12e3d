"""The README's code blocks, as the README test runs them: fenced ```bash and ```python blocks, in order, with the
markup that sizes them down.

The markup is an HTML comment on the line(s) just above a block, so nothing of it shows when the README is
rendered, and the visible commands stay what a user types::

    <!-- readme-test: skip (the setup itself; CI runs it) -->          the block is not run; the reason is required
    <!-- readme-test: sub "--epochs 200" "--epochs 3" -->            "OLD" -> "NEW" in the block's text before it
    ```bash                                                            runs (any number of pairs, several lines;
    haloflow train gcn --dataset ../shared/data/planetoid --epochs 200 every OLD must occur in the block)
    ```

A command that a test of its own already runs (same flags, a size of its own) need not run twice::

    <!-- readme-test: elsewhere "haloflow bench contention" tests/bench/test_contention.py -->

skips the block's commands that start with the text (as written, before any sub), naming the test file that runs
them instead; the file must exist and mention the command's subcommand and every one of its flags, so the pointer
cannot go stale either.

A bash block runs command by command (a command is a line, with its ``\\``-continued lines; blank and comment
lines are not commands); a python block runs whole, in one interpreter shared by every python block. Markup that
cannot be applied (an unknown word, a sub whose OLD no longer occurs, a comment not just above a bash or python
block) raises ``ValueError`` naming the README line, so the markup cannot go stale either.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "parse_blocks", "bash_commands"]

RUN_LANGS = ("bash", "python")
_MARKUP = re.compile(r"^<!--\s*readme-test:\s*(?P<body>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")
_SKIP = re.compile(r"^skip\s*\((?P<reason>.*)\)$")


@dataclass(frozen=True)
class Block:
    lang: str  # "bash" or "python"
    line: int  # README line of the block's first line of code (1-based)
    text: str  # the code, substitutions applied
    skip: str | None = None  # the reason, for a block that is not run
    elsewhere: tuple[tuple[int, str], ...] = field(default=())  # (README line of a command, test file running it)

    def runs_elsewhere(self, line: int) -> str | None:
        """The test file that runs the command starting at README ``line`` instead of the README test, or None."""
        return next((test for at, test in self.elsewhere if at == line), None)


def parse_blocks(text: str, source: str = "README.md", root: Path | None = None) -> list[Block]:
    """The bash and python blocks of a Markdown text, in order (other fenced blocks are not code to run)."""
    blocks: list[Block] = []
    markup: list[tuple[int, str]] = []  # (line, body) of the comments waiting for their block
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line_no, line = i + 1, lines[i]
        if m := _MARKUP.match(line):
            markup.append((line_no, m["body"]))
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if markup:
                raise ValueError(f"{source}:{markup[0][0]}: readme-test markup must be just above a ```bash or "
                                 f"```python block, but line {line_no} is {line[:60]!r}")
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{source}:{line_no}: code block never closed (expected a ``` line below)")
        lang, body = fence["lang"], "\n".join(lines[i + 1:end]) + "\n"
        if lang in RUN_LANGS:
            blocks.append(_apply(lang, line_no + 1, body, markup, source, root))
        elif markup:
            raise ValueError(f"{source}:{markup[0][0]}: readme-test markup above a ```{lang} block, which is not "
                             f"run (only {' and '.join(RUN_LANGS)} blocks are)")
        markup = []
        i = end + 1
    if markup:
        raise ValueError(f"{source}:{markup[0][0]}: readme-test markup at the end, with no code block below")
    return blocks


def _apply(lang: str, line: int, text: str, markup: list[tuple[int, str]], source: str,
           root: Path | None) -> Block:
    skip, elsewhere, original = None, [], text
    for at, body in markup:
        if m := _SKIP.match(body):
            skip = m["reason"].strip()
            if not skip:
                raise ValueError(f"{source}:{at}: skip needs a reason, as in 'skip (needs a GPU)'")
            continue
        try:
            words = shlex.split(body)
        except ValueError as err:
            raise ValueError(f"{source}:{at}: readme-test markup {body!r}: {err}") from None
        if words and words[0] == "elsewhere":
            elsewhere.extend(_elsewhere(words[1:], original, at, line, source, root))
            continue
        if not words or words[0] != "sub":
            raise ValueError(f"{source}:{at}: unknown readme-test markup {body!r}; expected 'skip (REASON)', "
                             "'sub \"OLD\" \"NEW\" ...' or 'elsewhere \"COMMAND\" TEST_FILE'")
        pairs = words[1:]
        if not pairs or len(pairs) % 2:
            raise ValueError(f"{source}:{at}: sub takes pairs \"OLD\" \"NEW\", got {len(pairs)} strings")
        for old, new in zip(pairs[::2], pairs[1::2]):
            if old not in text:
                raise ValueError(f"{source}:{at}: sub {old!r} does not occur in the block at line {line}: update "
                                 "the markup to the block's text, or remove it")
            text = text.replace(old, new)
            if text.count("\n") != original.count("\n"):
                raise ValueError(f"{source}:{at}: sub {old!r} -> {new!r} changes the block's lines")
    if elsewhere and lang != "bash":
        raise ValueError(f"{source}:{markup[0][0]}: elsewhere names commands, so only a ```bash block takes it")
    return Block(lang, line, text, skip, tuple(elsewhere))


def _elsewhere(words: list[str], text: str, at: int, line: int, source: str,
               root: Path | None) -> list[tuple[int, str]]:
    """(README line, test file) of each command of the block (as written, before any sub) starting with the text."""
    if len(words) != 2:
        raise ValueError(f"{source}:{at}: elsewhere takes \"COMMAND\" TEST_FILE, got {len(words)} strings")
    prefix, test = words
    commands = [(start, cmd) for start, cmd in bash_commands(Block("bash", line, text))
                if cmd.lstrip().startswith(prefix)]
    if not commands:
        raise ValueError(f"{source}:{at}: elsewhere {prefix!r}: no command of the block at line {line} starts so")
    if root is not None:
        path = root / test
        if not path.is_file():
            raise ValueError(f"{source}:{at}: elsewhere names {test}, which does not exist")
        known = path.read_text()
        for start, cmd in commands:  # the test runs the same command: its subcommand and every flag
            words = shlex.split(cmd.replace("\\\n", " "), comments=True)
            lead = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
            names = [w for w in words[1:lead] if "/" not in w][-1:]  # "haloflow bench cache": cache
            missing = [w for w in names + [w for w in words if w.startswith("--")] if w not in known]
            if missing:
                raise ValueError(f"{source}:{at}: elsewhere names {test} for the command at line {start}, but "
                                 f"it never mentions {', '.join(map(repr, missing))}")
    return [(start, test) for start, _ in commands]


def bash_commands(block: Block) -> list[tuple[int, str]]:
    """(README line, command) for each command of a bash block; a command ending in ``\\`` goes on below."""
    commands: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for offset, line in enumerate(block.text.splitlines()):
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = block.line + offset
        pending.append(line)
        if not line.rstrip().endswith("\\"):
            commands.append((start, "\n".join(pending)))
            pending = []
    if pending:
        commands.append((start, "\n".join(pending)))
    return commands
