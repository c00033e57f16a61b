"""The job's settings as flags: an on/off setting's spellings and what each gives."""

import pytest

from training.config.run_config import build_parser
from training.config.settings import switch_values


def test_a_switch_has_each_spelling_and_its_negation_as_the_parser_takes_them():
    switches = switch_values("use_gpu")
    assert switches == {"--use-gpu": True, "--gpu": True, "--no-use-gpu": False, "--no-gpu": False}
    for flag, value in switches.items():
        assert build_parser().parse_args([flag]).use_gpu is value


def test_only_a_setting_of_that_name_has_switches():
    with pytest.raises(StopIteration):
        switch_values("no_such_setting")
