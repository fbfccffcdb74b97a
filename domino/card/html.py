"""The card's Markdown files as standalone HTML pages, which Snakemake's HTML report shows.

A page needs nothing beside it: the plots it links to are embedded as ``data:`` URIs (the report
shows each page in a frame of its own, where a relative link resolves to nothing), links to a
sibling ``.md`` file point at its ``.html`` page, and the card's YAML front matter is kept in a
folded block at the top.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt

from ..io import write_text

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70rem; margin: 1.5rem auto; padding: 0 1rem;
       line-height: 1.45; color: #1f2328; }
table { border-collapse: collapse; margin: 0.8rem 0; font-size: 0.92rem; }
th, td { border: 1px solid #d0d7de; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
img { max-width: 100%; }
code { background: #f6f8fa; padding: 0 0.2rem; }
blockquote { border-left: 0.25rem solid #d0d7de; margin-left: 0; padding-left: 1rem; color: #3d444d; }
"""
FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)
LOCAL_LINK = re.compile(r'(src|href)="([^":#?/][^":#?]*)(#[^"]*)?"')


def _link(match: re.Match, folder: Path) -> str:
    attr, target, anchor = match[1], match[2], match[3] or ""
    path = folder / target
    if attr == "src" and path.suffix == ".png" and path.exists():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'src="data:image/png;base64,{data}"'
    if attr == "href" and path.suffix == ".md":
        return f'href="{Path(target).with_suffix(".html").as_posix()}{anchor}"'
    return match[0]


def markdown_html(text: str, folder: Path, title: str = "") -> str:
    """A whole HTML page of the Markdown ``text``, whose relative links resolve in ``folder``."""
    front = FRONT_MATTER.match(text)
    body = text[front.end():] if front else text
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    rendered = LOCAL_LINK.sub(lambda m: _link(m, folder), md.render(body))
    rendered = _anchor_headings(rendered)
    meta = (f"<details><summary>Front matter (Hugging Face metadata)</summary><pre>{html.escape(front[1])}</pre>"
            "</details>\n" if front else "")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{meta}{rendered}</body>\n</html>\n")


def slug(heading: str) -> str:
    """The anchor GitHub and the Hub give a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", html.unescape(heading)).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchor_headings(rendered: str) -> str:
    """Give each heading the id its Markdown anchor links (``#scale-of-this-run``) expect."""
    return re.sub(r"<(h[1-6])>(.*?)</\1>", lambda m: f'<{m[1]} id="{slug(m[2])}">{m[2]}</{m[1]}>', rendered)


def write_html(text: str, out: str | Path) -> Path:
    """Write the HTML page of Markdown ``text`` to ``out``, with the plots beside it embedded."""
    out = Path(out)
    heading = re.search(r"^# (.+)$", text, re.M)
    write_text(out, markdown_html(text, out.parent, heading[1] if heading else out.stem))
    return out
