"""docs/configuration.md is the page `make docs` writes from the parameters' declarations."""

from __future__ import annotations

from pipeline import config_doc


def test_configuration_page_is_current():
    with open(config_doc.PAGE, encoding="utf-8") as f:
        written = f.read()
    assert written == config_doc.render(), "docs/configuration.md is out of date: run make docs"


def test_page_has_each_training_setting_with_its_default_and_recipe_value():
    lines = config_doc.render().splitlines()
    (epochs,) = [line for line in lines if line.startswith("| `epochs` |")]
    assert epochs.split(" | ")[1:4] == ["int", "`15`", "`35`"]
    (augment,) = [line for line in lines if line.startswith("| `augment` |")]
    assert "one of `flip-shift`, `off`" in augment and "Choices:" not in augment


def test_page_escapes_what_would_break_a_table_row():
    lines = config_doc.render().splitlines()
    (dataset,) = [line for line in lines if line.startswith("| `dataset` |")]
    assert "\\|jpg" in dataset and dataset.count(" | ") == 4
