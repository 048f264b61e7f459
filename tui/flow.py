"""Text laid out at the width a panel is drawn at, so that it is wrapped once, to that width
(a text wrapped beforehand to a guessed width is wrapped again by a narrower panel: every
other line a stub). A paragraph is a list of parts joined by ' · ' and broken between parts
only, never inside a figure; a part wider than a line is word-wrapped; the lines after a
paragraph's first are indented (a hanging indent); anything still too wide (one long word)
ends in an ellipsis."""
from __future__ import annotations

import re
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

SEP = " · "
HANG = 2                 # the indent of a paragraph's continuation lines, past its own


def text(part: str | Text) -> Text:
    """A part given as console markup, or as rich Text."""
    return part if isinstance(part, Text) else Text.from_markup(part)


@dataclass(frozen=True)
class Para:
    # markup kept as given until drawn: a panel rebuilt at every refresh compares strings, and
    # parses only when its text changed
    parts: tuple[str | Text, ...]
    indent: int = 0              # of its first line
    hang: int = HANG             # and of the others, past that

    @classmethod
    def of(cls, *parts: str | Text, indent: int = 0, hang: int = HANG) -> "Para":
        return cls(tuple(p for p in parts if p), indent, hang)

    @property
    def plain(self) -> str:
        return " " * self.indent + SEP.join(text(p).plain for p in self.parts)

    def lines(self, width: int) -> list[Text]:
        hang = " " * (self.indent + self.hang)
        out: list[Text] = []
        line = Text(" " * self.indent)
        empty = True                     # nothing but the indent on the line so far
        for part in map(text, self.parts):
            if not empty and line.cell_len + len(SEP) + part.cell_len <= width:
                line.append(SEP)
                line.append_text(part)
                continue
            if not empty:
                out.append(line)
                line = Text(hang)
            room = width - line.cell_len
            if part.cell_len <= room:
                line.append_text(part)
                empty = False
                continue
            pieces = _word_wrap(part, room, width - len(hang))
            line.append_text(pieces[0])
            for piece in pieces[1:]:
                out.append(line)
                line = Text(hang)
                line.append_text(piece)
            empty = False
        out.append(line)
        for one in out:
            one.truncate(width, overflow="ellipsis")
        return out


def _word_wrap(part: Text, first: int, rest: int) -> list[Text]:
    """The part cut between words into lines of `first` cells, then `rest` cells."""
    pieces, start, end, room = [], None, None, first
    for word in re.finditer(r"\S+", part.plain):
        if start is None:
            start, end = word.start(), word.end()
        elif word.end() - start <= room:
            end = word.end()
        else:
            pieces.append(part[start:end])
            start, end, room = word.start(), word.end(), rest
    pieces.append(part[start:end] if start is not None else Text())
    return pieces


@dataclass(frozen=True)
class Flow:
    """Paragraphs, each starting on a new line, laid out at the width they are drawn at."""
    paras: tuple[Para, ...]

    @classmethod
    def of(cls, *paras: Para) -> "Flow":
        return cls(tuple(paras))

    def __str__(self) -> str:
        return "\n".join(p.plain for p in self.paras)

    def lines(self, width: int) -> list[Text]:
        return [line for p in self.paras for line in p.lines(max(width, 1))]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.lines(options.max_width):
            line.no_wrap = True
            yield line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, max((len(p.plain) for p in self.paras), default=1))
