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
    width: int                       # 0: what the other columns leave
    cell: Callable[[RankRow], str]
    sort: Callable[[RankRow], object]
    reverse: bool = False            # sorted largest first
    right: bool = False              # right-aligned (numbers)
    style: Callable[[RankRow], str | None] | None = None   # a rich style for the cell, or None


def fit(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        return text[:max(width - 1, 0)] + "…" if width > 0 else ""
    return text.rjust(width) if right else text.ljust(width)


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
        self.empty_text = ""
        self._drawn: dict[int, tuple] = {}      # screen line -> what was drawn there

    # data

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def set_rows(self, rows: list[RankRow], sort_index: int = 0, empty_text: str = "") -> None:
        """New rows (sorted and filtered): the cursor stays on the same rank when it is still
        there; only lines whose content changed are repainted."""
        selected = self.rows[self.cursor_row].key if self.rows and self.cursor_row < len(self.rows) else None
        header_changed = sort_index != self.sort_index
        self.rows, self.sort_index, self.empty_text = rows, sort_index, empty_text
        if selected is not None:
            for i, r in enumerate(rows):
                if r.key == selected:
                    self.cursor_row = i
                    break
        self.cursor_row = max(0, min(self.cursor_row, len(rows) - 1))
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        self._scroll_to_cursor()
        if header_changed:
            self._drawn.pop(0, None)
        self._repaint_changed()

    def row_cells(self, row: RankRow) -> tuple[str, ...]:
        return tuple(c.cell(row) for c in self.columns)

    def row_texts(self) -> list[tuple[str, ...]]:
        """Every row's cells (for tests and tools; the screen formats only what it shows)."""
        return [self.row_cells(r) for r in self.rows]

    def current(self) -> RankRow | None:
        return self.rows[self.cursor_row] if self.rows else None

    # drawing

    def _widths(self, width: int) -> list[int]:
        fixed = sum(c.width for c in self.columns if c.width) + len(self.columns) - 1
        rest = max(width - fixed - 1, 8)
        return [c.width or rest for c in self.columns]

    def _visible(self) -> range:
        top = int(self.scroll_y)
        return range(top, min(top + max(self.size.height - 1, 0), len(self.rows)))

    def _line_content(self, y: int) -> tuple:
        """What screen line y shows: the identity of its drawing (compared to repaint)."""
        if y == 0:
            return ("header", self.sort_index, self.size.width)
        i = int(self.scroll_y) + y - 1
        if i >= len(self.rows):
            return ("empty", self.empty_text if i == 0 else "", self.size.width)
        return ("row", i == self.cursor_row, i % 2, self.row_cells(self.rows[i]), self.size.width)

    def _repaint_changed(self) -> None:
        width = self.size.width
        for y in range(self.size.height):
            content = self._line_content(y)
            if self._drawn.get(y) != content:
                self._drawn[y] = content
                self.refresh(Region(0, y, width, 1))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        widths = self._widths(width)
        content = self._line_content(y)
        self._drawn[y] = content
        if content[0] == "header":
            style = self.get_component_rich_style("ranktable--header")
            titles = []
            for i, (c, w) in enumerate(zip(self.columns, widths)):
                if i == self.sort_index:      # the sorted column: its title and ▲ (ascending) or ▼
                    mark = "▼" if c.reverse else "▲"
                    title = fit(c.title, w - 1, False).rstrip() + mark
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
        for i, (c, w, text) in enumerate(zip(self.columns, widths, cells)):
            if i:
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
