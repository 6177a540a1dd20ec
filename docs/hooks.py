"""MkDocs hook (mkdocs.yml `hooks:`): pages whose Markdown lives outside docs/.

tests/README.md and benchmarks/README.md stay beside the code they describe, where GitHub shows
them. A hook rather than the include-markdown plugin: the plugin needs a stub page in docs/
holding only an include directive (raw text on GitHub) and one more pinned dependency; this
hands each README to MkDocs as a page at build time with MkDocs' own API (File.generated, 1.6),
and a link in it that leads out of the site still fails `mkdocs build --strict`.
"""

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent

# The site's page -> the Markdown it is built from, relative to the repository's root.
OUTSIDE = {"tests.md": "tests/README.md", "performance.md": "benchmarks/README.md"}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for page, source in OUTSIDE.items():
        if (ROOT / source).is_file():  # benchmarks/README.md: only once it is written
            files.append(File.generated(config, page, abs_src_path=str(ROOT / source)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    # docs/*.md link to these READMEs as ../tests/README.md (right on GitHub); on the site the
    # README is the page beside them.
    for name, source in OUTSIDE.items():
        markdown = markdown.replace(f"](../{source})", f"]({name})")
    return markdown
