"""The report as one self-contained HTML file: `to_html(document, figures_dir, title)` renders the same blocks as
`to_markdown`. Every figure is embedded as a PNG data URI, the stylesheet and the table-sorting script are inline,
and a Content-Security-Policy forbids anything else: the file reads the same offline, attached to a mail or opened
years later. Text is HTML-escaped first, then document.py's inline Markdown subset becomes tags."""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path

from ..core.errors import StorageError
from ..core.storage import StoragePath, read_retrying
from .document import Block, Bullets, Document, Figure, Heading, Paragraph, Table

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALIGN = {"l": "left", "r": "right", "c": "center"}  # a column's class: numbers (right) never wrap

# Inline spans: a code span or a link; the text between them gets bold and italic. Code is never formatted further.
_SPANS = re.compile(r"`([^`]+)`|\[([^\]]+)\]\(([^()\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_ITALIC = re.compile(r"\*(?=[^\s*])(.+?)(?<=[^\s*])\*")
_SAFE_URL = re.compile(r"^(https?:|mailto:|#|[^:]*$)", re.IGNORECASE)  # no javascript: or data: links

# Header cells wrap and numbers do not: the trial table's columns fit a 1280-px window; a table still wider scrolls
# inside its own box, never the page, and a long path in the prose breaks rather than widen it.
STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 80em;
  padding: 0 1em; color: #1f2328; }
h1, h2, h3 { line-height: 1.25; } h2 { border-bottom: 1px solid #d1d9e0; padding-bottom: .3em; margin-top: 2em; }
code { font: 85% ui-monospace, "DejaVu Sans Mono", monospace; background: #eff1f3; padding: .1em .3em;
  border-radius: 4px; }
.table { overflow-x: auto; max-width: 100%; margin: 1em 0; }
table { border-collapse: collapse; font-size: 90%; }
th, td { border: 1px solid #d1d9e0; padding: .3em .6em; text-align: left; }
.right { text-align: right; } td.right { white-space: nowrap; } .center { text-align: center; }
p code, li code { overflow-wrap: anywhere; }
th { background: #f6f8fa; cursor: pointer; user-select: none; }
th[aria-sort=ascending]::after { content: " \\25B2"; } th[aria-sort=descending]::after { content: " \\25BC"; }
tbody tr:nth-child(even) { background: #f6f8fa; }
figure { margin: 1em 0; } img { max-width: 100%; height: auto; } figcaption { color: #59636e; font-size: 90%; }
"""

# Click a header to sort its table by that column; click again to reverse. Cells compare as numbers when they start
# with one ("1,234", "12.5 %", "−0.4 pp", "71.00 (4)"); text compares naturally; empty and "—" cells stay last.
SORT_SCRIPT = """
function cellNumber(text) {
  var match = text.replace(/,/g, "").replace(/\\u2212/g, "-").match(/^\\s*([+-]?\\d+(?:\\.\\d+)?(?:e[+-]?\\d+)?)/i);
  return match ? parseFloat(match[1]) : null;
}
function compareCells(a, b) {
  var x = cellNumber(a), y = cellNumber(b);
  if (x !== null && y !== null) return x - y;
  if (x !== null || y !== null) return x !== null ? -1 : 1;
  return a.localeCompare(b, undefined, {numeric: true});
}
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0], column = th.cellIndex;
    var sign = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    table.querySelectorAll("th").forEach(function (other) { other.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", sign > 0 ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r, s) {
      var a = r.cells[column].textContent.trim(), b = s.cells[column].textContent.trim();
      var blankA = a === "" || a === "\\u2014", blankB = b === "" || b === "\\u2014";
      if (blankA || blankB) return blankA - blankB;
      return sign * compareCells(a, b);
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
"""


def _emphasis(escaped: str) -> str:
    return _ITALIC.sub(r"<em>\1</em>", _BOLD.sub(r"<strong>\1</strong>", escaped))


def inline_html(text: str) -> str:
    """document.py's inline Markdown as HTML: everything escaped, then `code`, **bold**, *italic* and [text](url)
    (a link to anything but http(s), mailto, an anchor or a relative path stays text)."""
    parts, start = [], 0
    for span in _SPANS.finditer(text):
        parts.append(_emphasis(html.escape(text[start : span.start()])))
        code, label, url = span.groups()
        if code is not None:
            parts.append(f"<code>{html.escape(code)}</code>")
        elif _SAFE_URL.match(url):
            parts.append(f'<a href="{html.escape(url)}">{_emphasis(html.escape(label))}</a>')
        else:
            parts.append(_emphasis(html.escape(span.group(0))))
        start = span.end()
    parts.append(_emphasis(html.escape(text[start:])))
    return "".join(parts)


def figure_data_uri(figures_dir: str | Path | StoragePath, file: str) -> str:
    """The figure's PNG as a data URI. A missing file or one that is not a PNG is a StorageError (after retries):
    the page never shows a broken image."""
    path = StoragePath.of(figures_dir) / file

    def png(data: bytes) -> bytes:
        if not data.startswith(PNG_SIGNATURE):
            raise ValueError("not a PNG file")
        return data

    data = read_retrying(path, png, None)
    if data is None:
        raise StorageError(f"cannot embed figure {path}: no such file; the HTML report embeds every plot it shows")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _table_html(table: Table) -> str:
    align = table.align or "l" * len(table.headers)

    def cells(tag: str, row: tuple[str, ...]) -> str:
        return "".join(f'<{tag} class="{ALIGN[a]}">{inline_html(str(cell))}</{tag}>' for cell, a in zip(row, align))

    table_id = f' id="{html.escape(table.name)}"' if table.name else ""
    # A table without header text (the report's header table of name/value rows) shows no empty header row.
    head = f"<thead><tr>{cells('th', table.headers)}</tr></thead>\n" if any(table.headers) else ""
    rows = "\n".join(f"<tr>{cells('td', row)}</tr>" for row in table.rows)
    return f'<div class="table"><table class="sortable"{table_id}>\n{head}<tbody>\n{rows}\n</tbody></table></div>'


def block_html(block: Block, figures_dir: str | Path | StoragePath) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{inline_html(block.text)}</h{block.level}>"
    if isinstance(block, Paragraph):
        return f"<p>{inline_html(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>\n" + "\n".join(f"<li>{inline_html(item)}</li>" for item in block.items) + "\n</ul>"
    if isinstance(block, Table):
        return _table_html(block)
    if isinstance(block, Figure):
        return (
            f'<figure><img src="{figure_data_uri(figures_dir, block.file)}" alt="{html.escape(block.caption)}">'
            f"<figcaption>{inline_html(block.caption)}</figcaption></figure>"
        )
    raise TypeError(f"not a report block: {block!r}")


def _script_hash(script: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode("ascii")


def to_html(document: Document, figures_dir: str | Path | StoragePath, title: str) -> str:
    """The document as one HTML page that needs nothing else: figures (PNG files in `figures_dir`) as data URIs,
    every table sortable by a click on a column header (tables carry their `name` as id), `title` as the page's
    title. StorageError for a figure that cannot be read; ValueError for two tables with one name."""
    names = [block.name for block in document if isinstance(block, Table) and block.name]
    if len(names) != len(set(names)):
        raise ValueError(f"table names must be unique (they are the page's ids): {sorted(names)}")
    body = "\n".join(block_html(block, figures_dir) for block in document)
    # Only the inline stylesheet, this one script (by its hash) and data: images may load: nothing from a network.
    policy = f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src '{_script_hash(SORT_SCRIPT)}'"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"{body}\n<script>{SORT_SCRIPT}</script>\n</body>\n</html>\n"
    )
