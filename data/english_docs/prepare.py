"""English prose available offline: the manuals four Debian packages install, as text, one document per page.

    sudo apt-get install debian-handbook debian-reference-en python3.11-doc postgresql-doc-15
    python data/english_docs/prepare.py [--encoding=bytes] [--val_fraction=0.05] [--out_dir=...]

The Debian Administrator's Handbook (English), the Debian Reference (English), the Python 3.11 documentation
and the PostgreSQL 15 manual, read from their HTML pages under /usr/share: about 14 MB of English text, mostly
running prose, technical, no download. Each page (a .html file, or .html.gz) is one document: its text in the
order it reads, one paragraph a line and a blank line between paragraphs (html.parser, no dependency).
Navigation, tables of contents, scripts, styles, code blocks (<pre>) and tables are left out, and so are
indexes, release notes, changelogs, licences and the pages that are only a title (a part's table of contents).
Byte-level by default (vocab 256, end-of-text = byte 0, which the text never holds), like data/python_stdlib;
--encoding=gpt2 (or another) gives a BPE corpus. meta.json's 'source' names the packages and their versions:
other versions give another text (and a corpus of another source: --overwrite replaces it). The split is by
page, deterministic for a --seed.

Any other text: data/prepare.py (data/README.md).
"""
import argparse
import fnmatch
import gzip
import os
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data.prepare import add_options, options, prepare, report, run_preparer  # noqa: E402

DOC_ROOT = Path("/usr/share")  # where Debian installs the manuals (the tests point it elsewhere)


@dataclass(frozen=True)
class Manual:
    package: str            # the Debian package that installs it
    folder: str             # its pages' folder, under DOC_ROOT
    include: tuple          # which pages: patterns of their paths under folder, less any .gz (fnmatch: * matches /)
    exclude: tuple = ()     # pages left out: indexes, tables of contents, release notes, changelogs, licences


MANUALS = (
    Manual("debian-handbook", "doc/debian-handbook/html/en-US", ("*.html",), ("index.html",)),
    Manual("debian-reference-en", "debian-reference", ("*.en.html",), ("index.en.html",)),
    Manual("python3.11-doc", "doc/python3.11/html", ("*.html",),
           ("_*", "genindex*", "py-modindex.html", "search.html", "contents.html", "copyright.html", "license.html",
            "download.html", "whatsnew/changelog.html")),
    Manual("postgresql-doc-15", "doc/postgresql-doc-15/html", ("*.html",),
           ("index.html", "release*.html", "bookindex.html", "legalnotice.html")),
)

SKIP_TAGS = {"head", "script", "style", "noscript", "template", "nav", "header", "footer", "pre", "table", "svg",
             "math", "form", "button", "select", "textarea", "iframe", "object"}  # pre: code; table: cells, not prose
SKIP_CLASSES = {  # navigation, tables of contents, permalinks, code: Sphinx (Python) and DocBook (the others)
    "related", "sphinxsidebar", "footer", "headerlink", "toctree-wrapper", "contents", "highlight",
    "navheader", "navfooter", "docnav", "toc", "list-of-tables", "list-of-figures", "list-of-examples",
    "table", "informaltable"}  # DocBook wraps a table and its caption in <div class="table">
SKIP_ROLES = {"navigation", "search", "banner", "contentinfo"}
SKIP_IDS = {"banner"}  # the handbook's "Download the ebook"
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
             "track", "wbr"}  # no end tag: never the start of a skipped part
BLOCK_TAGS = {"address", "article", "aside", "blockquote", "body", "br", "caption", "dd", "details", "div", "dl",
              "dt", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "html", "li", "main", "ol",
              "p", "section", "summary", "table", "td", "th", "title", "tr", "ul"}


class _Text(HTMLParser):
    """A page's paragraphs: text between block tags, whitespace collapsed; skipped elements (with all they
    hold) contribute nothing."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs, self._words, self._skipping, self._depth = [], [], None, 0

    def _end_paragraph(self):
        paragraph = " ".join("".join(self._words).split())
        if paragraph:
            self.paragraphs.append(paragraph)
        self._words = []

    def _skipped(self, tag, attrs):
        attrs = dict(attrs)
        return (tag in SKIP_TAGS or attrs.get("role") in SKIP_ROLES or attrs.get("id") in SKIP_IDS
                or not SKIP_CLASSES.isdisjoint((attrs.get("class") or "").split()))

    def handle_starttag(self, tag, attrs):
        if self._skipping:
            if tag == self._skipping:  # an element of the skipped one's name inside it
                self._depth += 1
        elif tag not in VOID_TAGS and self._skipped(tag, attrs):
            self._end_paragraph()
            self._skipping, self._depth = tag, 1
        elif tag in BLOCK_TAGS:
            self._end_paragraph()

    def handle_startendtag(self, tag, attrs):  # <br/>, <div/>: an element with nothing inside
        if not self._skipping and tag in BLOCK_TAGS:
            self._end_paragraph()

    def handle_endtag(self, tag):
        if self._skipping:
            if tag == self._skipping:
                self._depth -= 1
                if self._depth == 0:
                    self._skipping = None
        elif tag in BLOCK_TAGS:
            self._end_paragraph()

    def handle_data(self, data):
        if not self._skipping:
            self._words.append(data)


def html_text(html):
    """The running text of an HTML page (module docstring): paragraphs separated by a blank line."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    parser._end_paragraph()
    return "\n\n".join(parser.paragraphs)


def page_text(path):
    """The text of an HTML file, gzip'ed (.gz) or not (UTF-8)."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    try:
        return html_text(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8") from None


def manual_pages(manual):
    """The pages of a manual (sorted paths; a page may be gzip'ed), [] when its folder is missing."""
    folder = Path(DOC_ROOT) / manual.folder
    if not folder.is_dir():
        return []
    pages = []
    for path in folder.rglob("*"):
        name = path.relative_to(folder).as_posix().removesuffix(".gz")
        if path.is_file() and any(fnmatch.fnmatch(name, p) for p in manual.include) \
                and not any(fnmatch.fnmatch(name, p) for p in manual.exclude):
            pages.append(path)
    return sorted(pages)


def installed_pages(manuals=MANUALS):
    """Every manual's pages, in the order of manuals; one line naming the apt-get command when any is missing."""
    pages = {manual: manual_pages(manual) for manual in manuals}
    missing = [manual for manual, found in pages.items() if not found]
    if missing:
        where = ", ".join(str(Path(DOC_ROOT) / m.folder) for m in missing)
        raise FileNotFoundError(f"the English manuals are not installed (no pages in {where}): "
                                f"sudo apt-get install {' '.join(m.package for m in missing)}")
    return pages


def package_version(package):
    """The installed version of a Debian package (dpkg-query), or 'version unknown'."""
    try:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    except OSError:
        return "version unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "version unknown"


def source_name(pages):
    packages = ", ".join(f"{m.package} {package_version(m.package)}" for m in pages)
    return (f"English manuals of Debian packages {packages}: their HTML pages under {DOC_ROOT} as text, "
            f"one document a page")


def documents(pages):
    """The pages' texts in order, but for pages of one paragraph: a title whose table of contents was left out."""
    for paths in pages.values():
        for path in paths:
            text = page_text(path)
            if "\n\n" in text:
                yield text


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    add_options(parser, encoding="bytes")
    args = parser.parse_args(argv)
    pages = installed_pages()
    meta = prepare(lambda: documents(pages), args.out_dir, source=source_name(pages), **options(args))
    report(meta, args.out_dir)
    return meta


if __name__ == "__main__":
    run_preparer(main, sys.argv[1:])
