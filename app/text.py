"""Untrusted text (model replies, harness errors, server bodies, imported files) made inert for
Streamlit's Markdown: no link, no image, no HTML, no icon font lookup; what it said is what shows.

Streamlit renders most text arguments (`st.markdown`, `st.error`, captions, labels, tooltips) as
GitHub Markdown. Backslash-escaping every ASCII punctuation character stops the syntax (links,
images, HTML, entities, `:color[...]`, math), but GFM also turns bare `http://x`, `www.x` and
`a@b.c` into links *after* parsing, on the unescaped text; a word joiner (U+2060, invisible) inside
those patterns stops that. `tests/test_app_inert.py` checks the result in Chromium."""

from __future__ import annotations

import html
import re
from typing import Any

_ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
WORD_JOINER = "\u2060"
# Bare links GFM recognises in text: a scheme's "://", "www." and an e-mail's "@"; and Streamlit's
# ":material/name:" icon shortcode.
_AUTOLINK = re.compile(r"(://|(?<![a-z0-9])www(?=\.)|@|:(?=material/))", re.IGNORECASE)


def md(text: Any) -> str:
    """`text` for any Markdown-rendering Streamlit call, shown literally and inertly; line breaks
    stay line breaks."""
    raw = str(text if text is not None else "")
    joined = _AUTOLINK.sub(lambda m: m.group(0)[:1] + WORD_JOINER + m.group(0)[1:], raw)
    escaped = _ASCII_PUNCTUATION.sub(r"\\\1", joined)
    return escaped.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "  \n")


def code(text: Any) -> str:
    """Inline code for Markdown (never a link inside a code span; a backtick becomes a quote and a
    line break a space, which a code span cannot hold)."""
    flat = str(text if text is not None else "").replace("`", "'").replace("\r", " ").replace("\n", " ")
    return "`" + (flat or " ") + "`"


def chart(text: Any) -> str:
    """Text for a Plotly label or hover text, which reads a little HTML (`<a href>` among it)."""
    return html.escape(str(text if text is not None else ""), quote=False)
