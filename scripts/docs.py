"""`make docs`: the API docs and user guide (pdoc), with the Markdown pages of docs/ beside them.

The pages are rendered with the Markdown renderer pdoc itself uses, into the same folder, so the
site's links between them work from `build/docs/index.html`.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path

import pdoc
import pdoc.render_helpers

ROOT = Path(__file__).resolve().parent.parent
PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;line-height:1.5;padding:0 1rem}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2rem .5rem}}code{{background:#f4f4f4}}</style>
</head><body><p><a href="jupyter_trainmate.html">jupyter_trainmate: API and user guide</a></p>{body}</body></html>
"""


def main(out: Path) -> int:
    pdoc.pdoc("jupyter_trainmate", "jupyter_trainmate.refactor", output_directory=out)
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8").replace(".md)", ".html)")
        title = html.escape(text.splitlines()[0].lstrip("# "))
        body = pdoc.render_helpers.to_html(text)
        (out / page.with_suffix(".html").name).write_text(PAGE.format(title=title, body=body))
        print(f"docs: {out / page.with_suffix('.html').name}")
    print(f"docs: {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "docs"))
