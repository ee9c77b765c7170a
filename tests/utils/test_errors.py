"""The one-line form of an exception that refusals quote."""

from bitfit_hf.utils.errors import first_line


def test_first_line_keeps_the_first_line_only():
    assert first_line(OSError("  no such file\nTraceback details\n")) == "no such file"


def test_an_empty_message_gives_the_type_name():
    assert first_line(ValueError()) == "ValueError"
    assert first_line(OSError("   ")) == "OSError"


def test_a_key_error_gives_its_key_without_the_quotes_str_adds():
    assert str(KeyError("base.bias")) == "'base.bias'"
    assert first_line(KeyError("base.bias")) == "base.bias"
