"""Corpus discovery: which files under --data/--eval-data are read, in which order, and how each is
read, on folders made for each test and the shipped corpus."""

from __future__ import annotations

import pytest

from training.config.corpus_files import CORPUS_SUFFIXES, SHIPPED_CORPUS, corpus_files, corpus_format


def test_a_folder_gives_its_corpus_files_at_any_depth_sorted_and_absolute(tmp_path, monkeypatch):
    for name in ("b.txt", "a/z.jsonl", "a/notes.md", "c.parquet", "README", "d.csv", "e.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    monkeypatch.chdir(tmp_path)
    expected = [str(tmp_path / name) for name in ("a/notes.md", "a/z.jsonl", "b.txt", "c.parquet", "e.json")]
    assert corpus_files(".") == expected
    assert corpus_files("b.txt") == [str(tmp_path / "b.txt")]


def test_the_shipped_corpus_is_its_text_files_and_its_json_lines():
    files = corpus_files(str(SHIPPED_CORPUS))
    assert [name.rsplit("/", 1)[1] for name in files] == sorted(
        path.name for path in SHIPPED_CORPUS.iterdir()
    )
    assert {corpus_format(name) for name in files} == {"text", "json"}


def test_a_missing_path_names_its_flag_and_only_data_offers_synthetic(tmp_path):
    missing = str(tmp_path / "nothing")
    with pytest.raises(
        ValueError, match=r"^--data '.*nothing': no such file or folder \(or use 'synthetic'\)$"
    ):
        corpus_files(missing)
    with pytest.raises(ValueError, match=r"^--eval-data '.*nothing': no such file or folder$"):
        corpus_files(missing, flag="--eval-data")


def test_a_folder_without_corpus_files_names_the_suffixes_read(tmp_path):
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"no \.txt/\.md/\.jsonl/\.json/\.parquet files in it"):
        corpus_files(str(tmp_path))


def test_the_suffix_says_how_a_file_is_read_and_others_are_refused():
    formats = {suffix: corpus_format(f"rows{suffix}") for suffix in CORPUS_SUFFIXES}
    assert formats == {
        ".txt": "text",
        ".md": "text",
        ".jsonl": "json",
        ".json": "json",
        ".parquet": "parquet",
    }
    with pytest.raises(ValueError, match=r"unsupported corpus file rows\.csv: use \.txt/"):
        corpus_format("rows.csv")
