"""A self-contained interactive SVG flamegraph, so ``curl host:port/flamegraph.svg`` gives a picture.

Click a frame to zoom into it, click the background or press Escape to reset, press Ctrl-F or
``/`` to search with a regular expression (matches turn purple, their share is shown).
Every name from the profile is XML-escaped: it is text, never markup.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from xml.sax.saxutils import escape, quoteattr

from .profile import Node, build_tree, shown_frame

WIDTH = 1200
ROW = 16
MIN_WIDTH_PX = 0.3  # narrower frames are not drawn; their time stays in their parent's width
MAX_FRAMES = 20_000

_SCRIPT = """
<![CDATA[
(function () {
  var svg = document.documentElement, frames = svg.getElementById('frames');
  var rows = frames.getElementsByTagName('g'), W = %(width)d, status = svg.getElementById('status');
  function attr(g, name) { return parseFloat(g.getAttribute(name)); }
  function layout(x0, x1, depth) {
    for (var i = 0; i < rows.length; i++) {
      var g = rows[i], a = attr(g, 'data-x'), b = a + attr(g, 'data-w'), d = attr(g, 'data-d');
      var inside = a >= x0 - 1e-9 && b <= x1 + 1e-9, above = d >= depth;
      var on = inside ? above : (a <= x0 && b >= x1 && d < depth);
      g.style.display = on ? '' : 'none';
      if (!on) continue;
      var l = Math.max(a, x0), r = Math.min(b, x1), x = (l - x0) / (x1 - x0) * W;
      var w = (r - l) / (x1 - x0) * W, rect = g.firstElementChild.nextElementSibling, text = rect.nextElementSibling;
      rect.setAttribute('x', x); rect.setAttribute('width', Math.max(w - 0.5, 0));
      text.setAttribute('x', x + 3);
      var name = g.getAttribute('data-n'), fit = Math.floor((w - 6) / 7);
      text.textContent = fit < 3 ? '' : (name.length <= fit ? name : name.slice(0, fit - 2) + '..');
      g.style.opacity = (on && !inside) ? 0.6 : 1;
    }
  }
  frames.addEventListener('click', function (e) {
    var g = e.target.closest('g'); if (!g) return;
    var a = attr(g, 'data-x');
    layout(a, a + attr(g, 'data-w'), attr(g, 'data-d')); e.stopPropagation();
  });
  svg.addEventListener('click', function () { layout(0, 1, 0); });
  function search() {
    var term = window.prompt('Search frames (regular expression):'); if (term === null) return;
    var re; try { re = new RegExp(term); } catch (err) { status.textContent = 'bad regex'; return; }
    var covered = [], total = 0;
    for (var i = 0; i < rows.length; i++) {
      var g = rows[i], hit = term !== '' && re.test(g.getAttribute('data-n'));
      g.firstElementChild.nextElementSibling.style.fill = hit ? 'rgb(230,0,230)' : '';
      if (!hit) continue;
      var a = attr(g, 'data-x'), b = a + attr(g, 'data-w');
      if (!covered.some(function (c) { return a >= c[0] && b <= c[1]; })) { covered.push([a, b]); total += b - a; }
    }
    status.textContent = term === '' ? '' : 'matched ' + (100 * total).toFixed(1) + '%%';
  }
  document.addEventListener('keydown', function (e) {
    if ((e.ctrlKey && e.key === 'f') || e.key === '/') { e.preventDefault(); search(); }
    if (e.key === 'Escape') layout(0, 1, 0);
  });
  layout(0, 1, 0);
})();
]]>
"""


def _colour(name: str) -> str:
    # Warm palette as flamegraph.pl's, stable per name so two graphs are comparable.
    h = zlib.crc32(name.encode())
    return f"rgb({205 + h % 50},{(h >> 8) % 180 + 50},{(h >> 16) % 55})"


def render(
    counts: Mapping[str, int],
    *,
    title: str = "Flame graph",
    unit_seconds: float = 0.01,
    mode: str = "cpu",
) -> str:
    """Renders folded counts as an interactive SVG flamegraph (root at the bottom)."""
    title = _xml_text(title)
    root = build_tree(counts)
    total = root.total
    rows: list[tuple[Node, float, int]] = []  # node, x offset as a share of the total, depth
    _place(root, 0.0, 0, total, rows)
    depth = max((d for _, _, d in rows), default=0) + 1
    height = (depth + 3) * ROW + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="12">',
        f"<title>{escape(title)}</title>",
        '<rect width="100%" height="100%" fill="#f8f8f0"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="16">{escape(title)}</text>',
        f'<text x="10" y="{height - 8}">{total} samples, {total * unit_seconds:.2f} s of {mode} time. '
        "Click to zoom, Esc to reset, Ctrl-F to search.</text>",
        f'<text id="status" x="{WIDTH - 10}" y="{height - 8}" text-anchor="end"></text>',
        '<g id="frames">',
    ]
    for node, x, d in rows:
        share = node.total / total if total else 0.0
        y = height - 40 - (d + 1) * ROW
        name = _xml_text(shown_frame(node.name))  # bidi overrides written out: no name passes
        # for another
        label = f"{name} ({node.total} samples, {100 * share:.2f}%)"
        parts.append(
            f'<g data-n={quoteattr(name)} data-x="{x:.9f}" data-w="{share:.9f}" data-d="{d}">'
            f"<title>{escape(label)}</title>"
            f'<rect x="{x * WIDTH:.2f}" y="{y}" width="{max(share * WIDTH - 0.5, 0):.2f}" '
            f'height="{ROW - 1}" rx="2" fill="{_colour(node.name)}"/>'
            f'<text x="{x * WIDTH + 3:.2f}" y="{y + ROW - 4}"></text></g>'
        )
    parts.append("</g>")
    parts.append(f'<script type="text/ecmascript">{_SCRIPT % {"width": WIDTH}}</script>')
    parts.append("</svg>\n")
    return "\n".join(parts)


# Characters XML 1.0 does not allow in a document, even escaped: most control characters,
# lone surrogates and the noncharacters U+FFFE and U+FFFF. Frame names have their controls
# escaped already; a title given in the URL need not. Compiled on first use (re caches it).
_NOT_XML = "[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]"


def _xml_text(text: str) -> str:
    """Returns ``text`` with each character XML forbids written out as ``[U+XXXX]``."""
    if re.search(_NOT_XML, text) is None:
        return text
    return re.sub(_NOT_XML, lambda m: f"[U+{ord(m.group()):04X}]", text)


def _place(
    node: Node, x: float, depth: int, total: int, rows: list[tuple[Node, float, int]]
) -> None:
    if not total or len(rows) >= MAX_FRAMES or node.total / total * WIDTH < MIN_WIDTH_PX:
        return
    rows.append((node, x, depth))
    offset = x
    for child in sorted(node.children.values(), key=lambda n: n.name):
        _place(child, offset, depth + 1, total, rows)
        offset += child.total / total
