"""The NUMBA_STREAMSAFE_* variables, read where they are defined
(``numba_streamsafe.core.settings``): each bad value and each name that is no
setting is refused with one line that names the variable, its value and what
it takes. The environment is changed with monkeypatch and read with
``Settings.from_env`` (the process's settings are left as they are); what a
user sees at import is tested in child processes (tests/numba/test_first_start.py).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numba_streamsafe.core.errors import InvalidArgument, InvalidSetting
from numba_streamsafe.core.settings import PREFIX, Settings, flag

CHOICES = {"NUMBA_STREAMSAFE_DRIVER": ("cuda", "sim"),
           "NUMBA_STREAMSAFE_RESOURCE": ("async", "direct"),
           "NUMBA_STREAMSAFE_FENCES": ("lazy", "eager"),
           "NUMBA_STREAMSAFE_UPSTREAM": ("driver", "rmm"),
           "NUMBA_STREAMSAFE_ACCESS": ("declared", "infer"),
           "NUMBA_STREAMSAFE_MODE": ("order", "check"),
           "NUMBA_STREAMSAFE_CHECK_REPORT": ("raise", "exit"),
           "NUMBA_STREAMSAFE_LAUNCH_GIL": ("auto", "release")}
SWITCHES = ("NUMBA_STREAMSAFE_DIRECT_LAUNCH", "NUMBA_STREAMSAFE_CHECK_ACCESS",
            "NUMBA_STREAMSAFE_IPC", "NUMBA_STREAMSAFE_TRANSPARENT",
            "NUMBA_STREAMSAFE_PURE_PYTHON")
#: The settings of other shapes, each tested below.
OTHERS = ("NUMBA_STREAMSAFE_OBSERVE", "NUMBA_STREAMSAFE_STACK_DEPTH",
          "NUMBA_STREAMSAFE_REPORT_FILE")


@pytest.fixture
def clean(monkeypatch):
    """No NUMBA_STREAMSAFE_ variable set (the test sets its own)."""
    import os

    for name in [n for n in os.environ if n.startswith(PREFIX)]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_every_setting_of_the_dataclass_is_validated_here():
    """The tables above cover every field: a new setting is tested once it is added."""
    names = {PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}
    assert names | {"NUMBA_STREAMSAFE_PURE_PYTHON"} == set(CHOICES) | set(SWITCHES) | set(OTHERS)


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_a_choice_takes_its_values_in_any_case_and_refuses_others(clean, name):
    field = name[len(PREFIX):].lower()
    for value in CHOICES[name]:
        clean.setenv(name, f" {value.upper()} ")
        assert getattr(Settings.from_env(), field) == value
    clean.setenv(name, "Nope")
    with pytest.raises(InvalidSetting) as info:
        Settings.from_env()
    error = info.value
    assert (error.name, error.value, error.allowed) == (name, "Nope", CHOICES[name])
    text = str(error)
    assert "\n" not in text and f"{name}='Nope'" in text
    assert all(repr(v) in text for v in CHOICES[name]) and "unset it" in text


@pytest.mark.parametrize("name", SWITCHES)
def test_a_switch_takes_on_and_off_words_and_refuses_others(clean, name):
    """Before, any value but 0/false/no/off was on: NUMBA_STREAMSAFE_IPC=2 or
    NUMBA_STREAMSAFE_TRANSPARENT=nope passed unnoticed."""
    for word, on in (("1", True), ("TRUE", True), ("yes", True), ("On", True),
                     ("0", False), ("false", False), ("NO", False), ("off", False)):
        clean.setenv(name, word)
        assert flag(name, not on) is on
        Settings.from_env()  # accepted
    clean.setenv(name, "")
    assert flag(name, True) is True and flag(name, False) is False
    for bad in ("2", "nope", "enabled"):
        clean.setenv(name, bad)
        with pytest.raises(InvalidSetting, match=f"{name}='{bad}' is not one of its values"):
            Settings.from_env()


@given(st.text(alphabet=st.characters(codec="ascii", exclude_characters="\x00"), max_size=12))
def test_a_mode_value_is_taken_exactly_when_it_is_one_of_the_values(value):
    import os

    old = os.environ.get("NUMBA_STREAMSAFE_MODE")
    os.environ["NUMBA_STREAMSAFE_MODE"] = value
    try:
        expected = value.strip().lower() or "order"
        if expected in ("order", "check"):
            assert Settings.from_env().mode == expected
        else:
            with pytest.raises(InvalidSetting):
                Settings.from_env()
    finally:
        if old is None:
            del os.environ["NUMBA_STREAMSAFE_MODE"]
        else:
            os.environ["NUMBA_STREAMSAFE_MODE"] = old


def test_a_name_that_is_no_setting_is_refused_with_the_closest_one(clean):
    clean.setenv("NUMBA_STREAMSAFE_MOD", "check")
    with pytest.raises(InvalidSetting) as info:
        Settings.from_env()
    text = str(info.value)
    assert "NUMBA_STREAMSAFE_MOD='check'" in text and "did you mean NUMBA_STREAMSAFE_MODE?" in text
    assert "NUMBA_STREAMSAFE_PURE_PYTHON" in info.value.allowed
    assert isinstance(info.value, InvalidArgument) and isinstance(info.value, ValueError)
    clean.delenv("NUMBA_STREAMSAFE_MOD")
    clean.setenv("NUMBA_STREAMSAFE_ZZZ", "1")
    with pytest.raises(InvalidSetting, match="is not a setting") as info:
        Settings.from_env()
    assert "did you mean" not in str(info.value)


def test_observe_is_auto_or_a_switch_and_on_in_check_mode_by_default(clean):
    assert Settings.from_env().observe == "auto" and not Settings.from_env().observing
    clean.setenv("NUMBA_STREAMSAFE_MODE", "check")
    assert Settings.from_env().observing
    for word, value in (("AUTO", "auto"), ("1", "on"), ("yes", "on"), ("0", "off"),
                        ("Off", "off")):
        clean.setenv("NUMBA_STREAMSAFE_OBSERVE", word)
        assert Settings.from_env().observe == value
    assert not Settings.from_env().observing  # off, in check mode too
    clean.setenv("NUMBA_STREAMSAFE_MODE", "order")
    clean.setenv("NUMBA_STREAMSAFE_OBSERVE", "1")
    assert Settings.from_env().observing  # on, in ordering mode too
    clean.setenv("NUMBA_STREAMSAFE_OBSERVE", "sometimes")
    with pytest.raises(InvalidSetting) as info:
        Settings.from_env()
    text = str(info.value)
    assert "\n" not in text and "NUMBA_STREAMSAFE_OBSERVE='sometimes'" in text
    assert all(repr(v) in text for v in ("auto", "1", "0"))


def test_the_stack_depth_is_an_int_in_its_range(clean):
    assert Settings.from_env().stack_depth == 8
    clean.setenv("NUMBA_STREAMSAFE_STACK_DEPTH", " 0 ")
    assert Settings.from_env().stack_depth == 0
    for bad in ("-1", "257", "eight"):
        clean.setenv("NUMBA_STREAMSAFE_STACK_DEPTH", bad)
        with pytest.raises(InvalidSetting, match=f"STACK_DEPTH='{bad}' is not one of its values"):
            Settings.from_env()


def test_the_report_file_is_a_path_or_none(clean, tmp_path):
    assert Settings.from_env().report_file is None
    clean.setenv("NUMBA_STREAMSAFE_REPORT_FILE", str(tmp_path / "races.jsonl"))
    assert Settings.from_env().report_file == str(tmp_path / "races.jsonl")
