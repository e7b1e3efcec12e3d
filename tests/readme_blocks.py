"""The README's code blocks, as the README test runs them: fenced ```bash and ```python blocks, in order, with the
markup that sizes them down.

The markup is an HTML comment on the line(s) just above a block, so nothing of it shows when the README is
rendered, and the visible commands stay what a user types::

    <!-- readme-test: skip (the setup itself; CI runs it) -->          the block is not run; the reason is required
    <!-- readme-test: sub "--epochs 200" "--epochs 3" -->            "OLD" -> "NEW" in the block's text before it
    ```bash                                                            runs (any number of pairs, several lines;
    haloflow train gcn --dataset ../shared/data/planetoid --epochs 200 every OLD must occur in the block)
    ```

A bash block runs command by command (a command is a line, with its ``\\``-continued lines; blank and comment
lines are not commands); a python block runs whole, in one interpreter shared by every python block. Markup that
cannot be applied (an unknown word, a sub whose OLD no longer occurs, a comment not just above a bash or python
block) raises ``ValueError`` naming the README line, so the markup cannot go stale either.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

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


def parse_blocks(text: str, source: str = "README.md") -> list[Block]:
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
            blocks.append(_apply(lang, line_no + 1, body, markup, source))
        elif markup:
            raise ValueError(f"{source}:{markup[0][0]}: readme-test markup above a ```{lang} block, which is not "
                             f"run (only {' and '.join(RUN_LANGS)} blocks are)")
        markup = []
        i = end + 1
    if markup:
        raise ValueError(f"{source}:{markup[0][0]}: readme-test markup at the end, with no code block below")
    return blocks


def _apply(lang: str, line: int, text: str, markup: list[tuple[int, str]], source: str) -> Block:
    skip = None
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
        if not words or words[0] != "sub":
            raise ValueError(f"{source}:{at}: unknown readme-test markup {body!r}; expected 'skip (REASON)' or "
                             "'sub \"OLD\" \"NEW\" ...'")
        pairs = words[1:]
        if not pairs or len(pairs) % 2:
            raise ValueError(f"{source}:{at}: sub takes pairs \"OLD\" \"NEW\", got {len(pairs)} strings")
        for old, new in zip(pairs[::2], pairs[1::2]):
            if old not in text:
                raise ValueError(f"{source}:{at}: sub {old!r} does not occur in the block at line {line}: update "
                                 "the markup to the block's text, or remove it")
            text = text.replace(old, new)
    return Block(lang, line, text, skip)


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
