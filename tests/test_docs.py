"""The pages a reader follows: every relative link in README.md, BENCHMARKS.md and docs/ leads to a file of this
repository (a link outside it, such as ../shared, is dead for anyone who cloned it alone)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_leads_to_a_file_of_the_repository():
    checked, dead = 0, []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            checked += 1
            if not path.exists() or REPO not in path.parents:
                dead.append(f"{page.relative_to(REPO)}: {target}")
    assert checked >= 5 and not dead, dead


def test_the_licence_pyproject_declares_is_in_the_repository():
    assert 'license = { text = "MIT" }' in (REPO / "pyproject.toml").read_text()
    assert (REPO / "LICENSE").read_text().startswith("MIT License")


def test_the_readme_is_a_front_door_that_reaches_every_docs_page():
    """README.md is what a newcomer reads in five minutes (at most about 300 lines); the rest is in docs/, every
    page of which the README links."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = set(LINK.findall(readme))
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages and pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
