"""The rank table: a Line API widget that formats only the rows on screen.

Textual's DataTable measures and stores every cell it is given: rebuilding 1,000 rows costs
~0.3-0.4 s and updating five cells of each ~0.1 s, far over a 100 ms frame (bench/tui.py
history in the module docstring there). Here a refresh hands over the sorted rows (the view
model's RankRows) and nothing is formatted until a line is drawn; only the screen lines
whose text changed are repainted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from slotscope.analyzer.view import RankRow


@dataclass(frozen=True)
class Column:
    title: str
    width: int                       # 0: what the other columns leave, at least min_width
    cell: Callable
    sort: Callable | None = None
    reverse: bool = False            # sorted largest first (until r reverses it)
    right: bool = False              # right-aligned (numbers)
    style: Callable[[RankRow], str | None] | None = None   # a rich style for the cell, or None
    priority: int = 0                # where columns do not all fit, the lowest go first
    min_width: int = 0


def fit(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        return text[:max(width - 1, 0)] + "…" if width > 0 else ""
    return text.rjust(width) if right else text.ljust(width)


def fit_path(path: str, width: int) -> str:
    """A path cut to `width` from the left, where its directories are: the file's name stays."""
    return path if len(path) <= width else "…" + path[len(path) - max(width - 1, 0):]


def fit_columns(columns: list[Column], width: int, keep: int | None = None) -> list[tuple[int, int]]:
    """(index, width) of the columns shown in `width` cells, in their order, one space apart.
    Columns that do not fit are dropped whole, lowest priority first, never `keep` (the sorted
    one); the flexible column (width 0) takes what the others leave. Were even the last ones too
    wide, the last is narrowed: its cells end in an ellipsis, a cut is never silent."""
    def need(shown):
        return sum(columns[i].width or columns[i].min_width for i in shown) + len(shown) - 1

    shown = list(range(len(columns)))
    for i in sorted((i for i in shown if i != keep), key=lambda i: columns[i].priority):
        if need(shown) <= width or len(shown) == 1:
            break
        shown.remove(i)
    spare = width - need(shown)
    out = [(i, columns[i].width or columns[i].min_width + max(spare, 0)) for i in shown]
    if spare < 0:
        i, w = out[-1]
        out[-1] = (i, max(w + spare, 1))
    return out


class RankTable(ScrollView, can_focus=True):
    """Rows, one per rank; a header line; a cursor row; enter selects."""

    DEFAULT_CSS = """
    RankTable {
        overflow-x: hidden;
        overflow-y: auto;
        background: $surface;
    }
    RankTable > .ranktable--header {
        text-style: bold;
        background: $panel;
        color: $foreground;
    }
    RankTable > .ranktable--odd {
        background: $surface-lighten-1;
    }
    RankTable > .ranktable--cursor {
        background: $block-cursor-blurred-background;
        color: $block-cursor-blurred-foreground;
    }
    RankTable:focus > .ranktable--cursor {
        background: $block-cursor-background;
        color: $block-cursor-foreground;
        text-style: $block-cursor-text-style;
    }
    """
    COMPONENT_CLASSES = {"ranktable--header", "ranktable--odd", "ranktable--cursor"}
    BINDINGS = [
        Binding("up", "move(-1)", "up", show=False),
        Binding("down", "move(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("ctrl+home", "edge(0)", "first", show=False),
        Binding("ctrl+end", "edge(1)", "last", show=False),
        Binding("enter", "select", "drill down"),
    ]

    class Selected(Message):
        """The user chose a row (enter, or a click on the cursor row)."""

        def __init__(self, table: "RankTable", row: RankRow):
            super().__init__()
            self.table = table
            self.row = row

    def __init__(self, columns: list[Column], **kw):
        super().__init__(**kw)
        self.columns = columns
        self.rows: list[RankRow] = []
        self.cursor_row = 0
        self.sort_index = 0
        self.descending = False
        self.empty_text = ""
        self._drawn: dict[int, tuple] = {}      # screen line -> what was drawn there
        self._layout: tuple = (None, [])

    # data

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def set_rows(self, rows: list[RankRow], sort_index: int = 0, descending: bool = False,
                 empty_text: str = "") -> None:
        """New rows (sorted and filtered): the cursor stays on the same rank when it is still
        there; only lines whose content changed are repainted."""
        selected = self.rows[self.cursor_row].key if self.rows and self.cursor_row < len(self.rows) else None
        self.rows, self.sort_index, self.descending, self.empty_text = rows, sort_index, descending, empty_text
        if selected is not None:
            for i, r in enumerate(rows):
                if r.key == selected:
                    self.cursor_row = i
                    break
        self.cursor_row = max(0, min(self.cursor_row, len(rows) - 1))
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        self._scroll_to_cursor()
        self._repaint_changed()

    def row_cells(self, row: RankRow) -> tuple[str, ...]:
        return tuple(c.cell(row) for c in self.columns)

    def row_texts(self) -> list[tuple[str, ...]]:
        """Every row's cells (for tests and tools; the screen formats only what it shows)."""
        return [self.row_cells(r) for r in self.rows]

    def current(self) -> RankRow | None:
        return self.rows[self.cursor_row] if self.rows else None

    # drawing

    @property
    def line_width(self) -> int:
        """The width of a line: the table's, less its scrollbar when it shows one."""
        return self.scrollable_content_region.width

    def layout(self) -> list[tuple[int, int]]:
        """(column index, width) of the columns that fit the table's width now."""
        key = (self.line_width, self.sort_index)
        if self._layout[0] != key:
            self._layout = (key, fit_columns(self.columns, self.line_width, keep=self.sort_index))
        return self._layout[1]

    def _visible(self) -> range:
        top = int(self.scroll_y)
        return range(top, min(top + max(self.size.height - 1, 0), len(self.rows)))

    def _line_content(self, y: int) -> tuple:
        """What screen line y shows: the identity of its drawing (compared to repaint)."""
        if y == 0:
            return ("header", self.sort_index, self.descending, self.line_width)
        i = int(self.scroll_y) + y - 1
        if i >= len(self.rows):
            return ("empty", self.empty_text if i == 0 else "", self.line_width)
        row = self.rows[i]
        cells = tuple(self.columns[c].cell(row) for c, _ in self.layout())
        return ("row", i == self.cursor_row, i % 2, cells, self.line_width)

    def _repaint_changed(self) -> None:
        width = self.size.width
        for y in range(self.size.height):
            content = self._line_content(y)
            if self._drawn.get(y) != content:
                self._drawn[y] = content
                self.refresh(Region(0, y, width, 1))

    def render_line(self, y: int) -> Strip:
        width = self.line_width
        layout = self.layout()
        content = self._line_content(y)
        self._drawn[y] = content
        if content[0] == "header":
            style = self.get_component_rich_style("ranktable--header")
            titles = []
            for i, w in layout:
                c = self.columns[i]
                if i == self.sort_index:      # the sorted column: its title and ▲ (ascending) or ▼
                    title = fit(c.title, w - 1, False).rstrip() + ("▼" if self.descending else "▲")
                    titles.append(fit(title, w, c.right))
                else:
                    titles.append(fit(c.title, w, c.right))
            return Strip([Segment(fit(" ".join(titles), width, False), style)], width)
        base = self.rich_style
        if content[0] == "empty":
            text = content[1]
            return Strip([Segment(fit(("  " + text) if text else "", width, False), base)], width)
        _, is_cursor, odd, cells, _ = content
        if is_cursor:
            style = base + self.get_component_rich_style("ranktable--cursor")
        elif odd:
            style = base + self.get_component_rich_style("ranktable--odd")
        else:
            style = base
        row = self.rows[int(self.scroll_y) + y - 1]
        segments = []
        used = 0
        for n, ((i, w), text) in enumerate(zip(layout, cells)):
            c = self.columns[i]
            if n:
                segments.append(Segment(" ", style))
                used += 1
            cell_style = style
            if c.style is not None and not is_cursor:
                extra = c.style(row)
                if extra:
                    cell_style = style + Style.parse(extra)
            segments.append(Segment(fit(text, w, c.right), cell_style))
            used += w
        if used < width:
            segments.append(Segment(" " * (width - used), style))
        return Strip(segments).crop(0, width)

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.rows) + 1)
        self._drawn.clear()
        self.refresh()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self._drawn.clear()

    # moving and choosing

    def _scroll_to_cursor(self) -> None:
        shown = max(self.size.height - 1, 1)
        top = int(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + shown:
            self.scroll_to(y=self.cursor_row - shown + 1, animate=False, immediate=True)

    def move_cursor(self, row: int) -> None:
        if not self.rows:
            return
        self.cursor_row = max(0, min(row, len(self.rows) - 1))
        self._scroll_to_cursor()
        self._repaint_changed()

    def action_move(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(self.size.height - 2, 1))

    def action_edge(self, last: int) -> None:
        self.move_cursor(len(self.rows) - 1 if last else 0)

    def action_select(self) -> None:
        row = self.current()
        if row is not None:
            self.post_message(self.Selected(self, row))

    def on_click(self, event: Click) -> None:
        if event.y < 1:
            return
        i = int(self.scroll_y) + event.y - 1
        if i >= len(self.rows):
            return
        if i == self.cursor_row:
            self.action_select()
        else:
            self.move_cursor(i)
