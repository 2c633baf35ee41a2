"""Rewrite the settings tables in docs/configuration.md from the config dataclasses (run after adding a setting)."""

from pathlib import Path

from ddplab.config import reference_markdown

readme = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
text = readme.read_text()
start, end = text.index("`[data]`"), text.index("Precision: `bf16`")
readme.write_text(text[:start] + reference_markdown().rstrip() + "\n\n" + text[end:])
