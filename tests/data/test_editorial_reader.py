"""The NYT editorial snippets read back into whole articles, sentences in order (the clm.py default)."""

from __future__ import annotations

import pytest

from bitfit_hf.data import read_editorial_articles
from bitfit_hf.data.assets import asset_path, asset_status


def test_sentences_are_joined_per_article_in_order(tmp_path):
    path = tmp_path / "nyt.txt"
    path.write_text("1_2\t0.1\tSecond.\n1_1\t-0.3\tFirst one.\n\n2_1\t0\tOther article.\n", encoding="utf-8")
    assert read_editorial_articles(path) == [{"id": "1", "text": "First one. Second."},
                                             {"id": "2", "text": "Other article."}]


@pytest.mark.parametrize("line, match", [("1_1\t0.2", "3 tab-separated"), ("x\t0\ttext", "article_sentence")])
def test_malformed_lines_name_file_and_line(tmp_path, line, match):
    path = tmp_path / "bad.txt"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"bad\.txt:1: .*{match}"):
        read_editorial_articles(path)


def test_real_file_counts():
    if asset_status("nyt_editorials", verify=False) != "ok":
        pytest.skip("nyt_editorials is not cached here (bitfit-hf assets fetch nyt_editorials)")
    articles = read_editorial_articles(asset_path("nyt_editorials"))
    assert len(articles) == 498
    assert articles[0]["text"].startswith("On Dec. 19, around noon, New York City's Union Square")
