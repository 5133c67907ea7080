"""The README's relative links, and those of docs/, point at files that exist: the README's
"How accurate" table sends the reader to docs/accuracy.md for the details and history, so a
moved or renamed file must not leave the link dangling."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(md: Path):
    for target in LINK.findall(md.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same file
        yield target, (md.parent / target.split("#")[0]).resolve()


def test_relative_links_resolve():
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    dangling = [f"{md.relative_to(REPO)} -> {t}" for md in files
                for t, path in _relative_links(md) if not path.exists()]
    assert not dangling, dangling


def test_readme_points_to_the_accuracy_details():
    targets = {path for _, path in _relative_links(REPO / "README.md")}
    assert (REPO / "docs/accuracy.md").resolve() in targets
    assert (REPO / "docs/accuracy.md").read_text().startswith("# How accurate, measured")
