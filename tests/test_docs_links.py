"""Every relative link of README.md and docs/*.md reaches a file, and its `#anchor` a heading
there (as GitHub names headings: lowercase, punctuation dropped, spaces as hyphens, a repeated
heading numbered)."""

import re

import pytest

from tests.scripts import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCED = re.compile(r"^```.*?^```", flags=re.DOTALL | re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(text):
    """The anchors GitHub gives the Markdown headings of `text` (fenced code left out)."""
    anchors, seen = set(), {}
    for line in FENCED.sub("", text).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*$", line)
        if heading:
            anchor = re.sub(r"[^\w\- ]", "", heading[1].lower()).replace(" ", "-")
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def broken_links(doc):
    """`[(link, why)]` for the relative links of `doc` that reach no file or no heading."""
    broken = []
    for link in LINK.findall(FENCED.sub("", doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", link):  # https://, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path) if path else doc
        if not target.exists():
            broken.append((link, "no such file"))
        elif anchor and target.suffix == ".md":
            if anchor not in heading_anchors(target.read_text(encoding="utf-8")):
                broken.append((link, "no such heading"))
    return broken


def test_heading_anchors_follow_githubs_rule():
    text = "# Results\n## Training on a GPU (2026-11-28, H100)\n```\n# not a heading\n```\n## Results\n"
    assert heading_anchors(text) == {"results", "training-on-a-gpu-2026-11-28-h100", "results-1"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_link_reaches_its_file_and_heading(doc):
    assert broken_links(doc) == []
