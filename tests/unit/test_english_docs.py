"""data/english_docs/prepare.py on small pages written here: no Debian package needs to be installed."""
import fnmatch
import gzip

import pytest

import data.english_docs.prepare as english_docs
from helpers import documents_of
from nanoaha.configurator import run_main

PAGE = """<!DOCTYPE html><html><head><title>Page title</title><style>p { color: red }</style>
<script>var x = "<p>not text</p>";</script></head><body>
<div class="related" role="navigation"><ul><li><a href="a.html">previous</a></li><li>next</li></ul></div>
<div id="banner"><a href="x">Download the ebook</a></div><ul class="docnav"><li>Prev</li><li>Next</li></ul>
<div class="body"><h1>Chapter 1. Tea<a class="headerlink" href="#tea">\u00b6</a></h1>
<div class="toc"><dl><dt><a href="#a">1.1. Brewing</a></dt><div><dd>nested</dd></div></dl></div>
<p>Tea is   brewed
by pouring <code>hot water</code> over leaves &amp; waiting.<br>A new line.</p>
<div class="highlight"><pre>kettle.boil()
pour()</pre></div><pre class="screen">$ make tea</pre>
<div class="table"><p class="title">Table 1.1. Teas</p><table><tr><td>green</td><td>black</td></tr></table></div>
<ul><li>Milk is optional.<img src="milk.png" alt="milk"></li><li>Sugar is too.</li></ul>
<p>It is ready in five minutes.</p></div>
<div class="footer">&copy; Copyright the authors</div><footer>Built with a tool</footer></body></html>"""

TEXT = ("Chapter 1. Tea\n\nTea is brewed by pouring hot water over leaves & waiting.\n\nA new line.\n\n"
        "Milk is optional.\n\nSugar is too.\n\nIt is ready in five minutes.")


def test_html_text_keeps_the_paragraphs_and_drops_navigation_scripts_styles_code_and_tables():
    assert english_docs.html_text(PAGE) == TEXT
    assert english_docs.html_text("<p>one</p>two<div>three <b>bold</b> four</div>") == "one\n\ntwo\n\nthree bold four"
    assert english_docs.html_text("<nav><div><div>menu</div></div>still menu</nav><p>after</p>") == "after"


def test_pages_are_read_plain_or_gzipped(tmp_path):
    (tmp_path / "page.html").write_text(PAGE, encoding="utf-8")
    (tmp_path / "page.html.gz").write_bytes(gzip.compress(PAGE.encode("utf-8")))
    assert english_docs.page_text(tmp_path / "page.html") == english_docs.page_text(tmp_path / "page.html.gz") == TEXT
    (tmp_path / "latin1.html").write_bytes("<p>caf\u00e9</p>".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.html is not UTF-8"):
        english_docs.page_text(tmp_path / "latin1.html")


def write_manuals(root, manuals=english_docs.MANUALS):
    """Two pages of prose per manual (one of them gzip'ed), a title-only page and the pages a manual leaves out."""
    for manual in manuals:
        folder = root / manual.folder
        (folder / "sub").mkdir(parents=True)
        name = manual.include[0].replace("*", "page")
        (folder / name).write_text(f"<h1>{manual.package}</h1><p>The first page of {manual.package}.</p>")
        (folder / "sub" / name).write_bytes(gzip.compress(f"<h1>Two</h1><p>More of {manual.package}.</p>".encode()))
        (folder / "sub" / name).rename(folder / "sub" / (name + ".gz"))
        (folder / name.replace("page", "only-a-title")).write_text("<h1>Part I</h1><div class='toc'>1. 2. 3.</div>")
        for excluded in manual.exclude:  # each of them plain and gzip'ed, where the manual would read it else
            path = folder / excluded.replace("*", "x/y.html")
            assert any(fnmatch.fnmatch(path.relative_to(folder).as_posix(), p) for p in manual.include)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("<p>left out</p><p>left out</p>")
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(b"<p>left out</p><p>left out</p>"))


def test_missing_manuals_are_one_line_naming_the_apt_get_command(tmp_path, monkeypatch):
    monkeypatch.setattr(english_docs, "DOC_ROOT", tmp_path)
    with pytest.raises(SystemExit) as exit:
        run_main(english_docs.main, [f"--out_dir={tmp_path / 'out'}"])
    message = str(exit.value.code)
    packages = " ".join(m.package for m in english_docs.MANUALS)
    assert message.startswith("error: ") and "\n" not in message and message.endswith(f"apt-get install {packages}")
    write_manuals(tmp_path, english_docs.MANUALS[1:])  # one manual still missing: only its package is named
    with pytest.raises(FileNotFoundError, match=f"apt-get install {english_docs.MANUALS[0].package}$"):
        english_docs.installed_pages()


def test_the_corpus_holds_each_pages_text_once(tmp_path, monkeypatch):
    write_manuals(tmp_path)
    monkeypatch.setattr(english_docs, "DOC_ROOT", tmp_path)
    monkeypatch.setattr(english_docs, "package_version", lambda package: "1.0")
    pages = english_docs.installed_pages()
    assert [len(found) for found in pages.values()] == [3] * len(english_docs.MANUALS)  # not the excluded pages
    meta = english_docs.main([f"--out_dir={tmp_path / 'out'}", "--val_fraction=0.5", "--num_proc=1"])
    assert (meta["encoding"], meta["vocab_size"]) == ("bytes", 256)
    assert meta["source"].startswith(f"English manuals of Debian packages {english_docs.MANUALS[0].package} 1.0, ")
    texts = sorted(documents_of(tmp_path / "out", "train") + documents_of(tmp_path / "out", "val"))
    expected = sorted(text for m in english_docs.MANUALS for text in (
        f"{m.package}\n\nThe first page of {m.package}.", f"Two\n\nMore of {m.package}."))
    assert texts == expected  # the title-only pages are no documents
