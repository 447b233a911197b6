"""Every error form: CronError (a ValueError) naming the field, the token and what is allowed."""

from __future__ import annotations

import pytest

from scheduling_core.cron import CronError, parse

# (spec, field, token, a phrase the message must contain)
FIELD_ERRORS: list[tuple[str, str, str, str]] = [
    # out of range, per field, low and high
    ("60 * * * *", "minute", "60", "60 is out of range"),
    ("* 24 * * *", "hour", "24", "24 is out of range"),
    ("* * 0 * *", "day-of-month", "0", "0 is out of range"),
    ("* * 32 * *", "day-of-month", "32", "32 is out of range"),
    ("* * * 0 *", "month", "0", "0 is out of range"),
    ("* * * 13 *", "month", "13", "13 is out of range"),
    ("* * * * 8", "day-of-week", "8", "8 is out of range"),
    ("1,2,99 * * * *", "minute", "99", "99 is out of range"),
    ("5-64/30 * * * *", "minute", "5-64/30", "64 is out of range"),
    ("* 20/30,99 * * *", "hour", "99", "out of range"),
    # start > end (the day-of-week range ending at Sunday is the one exception)
    ("5-1 * * * *", "minute", "5-1", "start 5 is after its end 1"),
    ("* * * dec-jan *", "month", "dec-jan", "start 12 is after its end 1"),
    ("* * * * 2-1", "day-of-week", "2-1", "start 2 is after its end 1"),
    ("* * * * sat-fri", "day-of-week", "sat-fri", "start 6 is after its end 5"),
    # step 0 and bad steps
    ("*/0 * * * *", "minute", "*/0", "step 0"),
    ("* * * * sun-sat/0", "day-of-week", "sun-sat/0", "step 0"),
    ("* */x * * *", "hour", "*/x", "step 'x'"),
    ("1/ * * * *", "minute", "1/", "step ''"),
    ("* * * */jan *", "month", "*/jan", "step 'jan'"),  # names are values, never steps
    ("*/-1 * * * *", "minute", "*/-1", "step '-1'"),
    # empty list elements
    ("1,,2 * * * *", "minute", "1,,2", "empty list element"),
    ("* 1, * * *", "hour", "1,", "empty list element"),
    ("* * ,1 * *", "day-of-month", ",1", "empty list element"),
    ("1- * * * *", "minute", "1-", "missing"),
    ("-5 * * * *", "minute", "-5", "missing"),
    # Quartz syntax
    ("* * ? * *", "day-of-month", "?", "'?' is Quartz syntax"),
    ("* * * * ?", "day-of-week", "?", "'?' is Quartz syntax"),
    ("* * L * *", "day-of-month", "L", "Quartz"),
    ("* * LW * *", "day-of-month", "LW", "Quartz"),
    ("* * 15W * *", "day-of-month", "15W", "Quartz"),
    ("* * * * 5L", "day-of-week", "5L", "Quartz"),
    ("* * * * 5#2", "day-of-week", "5#2", "'#'"),
    ("* * * * fri#1", "day-of-week", "fri#1", "'#'"),
    # not numbers, misplaced names, stray characters
    ("mon * * * *", "minute", "mon", "'mon' is not a number"),
    ("* * jan * *", "day-of-month", "jan", "'jan' is not a number"),
    ("* * * * january", "day-of-week", "january", "not a number or a name"),
    ("* * * jan-mon *", "month", "jan-mon", "'mon' is not a number or a name"),
    ("* * * * sun-jan", "day-of-week", "sun-jan", "'jan' is not a number or a name"),
    ("*5 * * * *", "minute", "*5", "not a number"),
    ("*-5 * * * *", "minute", "*-5", "'*' cannot be part of a range"),
    ("+5 * * * *", "minute", "+5", "signed"),
    ("1-2-3 * * * *", "minute", "1-2-3", "'2-3' is not a number"),
    ("1.5 * * * *", "minute", "1.5", "not a number"),
]


@pytest.mark.parametrize(("spec", "field", "token", "phrase"), FIELD_ERRORS)
def test_field_errors_name_field_token_and_what_is_allowed(
    spec: str, field: str, token: str, phrase: str
) -> None:
    with pytest.raises(CronError) as caught:
        parse(spec)
    error = caught.value
    message = str(error)
    assert isinstance(error, ValueError)
    assert error.field == field
    assert error.token == token
    assert message.startswith(f"{field} field: ")
    assert repr(token) in message
    assert phrase in message
    assert "allowed: " in message


ALLOWED = {
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31",
    "month": "1-12 or JAN-DEC",
    "day-of-week": "0-7 or SUN-SAT",
}


@pytest.mark.parametrize(("field", "allowed"), ALLOWED.items())
def test_messages_say_what_the_field_allows(field: str, allowed: str) -> None:
    fields = ["*"] * 5
    fields[list(ALLOWED).index(field)] = "99"
    with pytest.raises(CronError, match=f"allowed: {allowed}"):
        parse(" ".join(fields))


@pytest.mark.parametrize(
    "spec", ["* * * * * *", "0 * * * * *", "* * * * * * *", "0 0 0 1 1 * 2026"]
)
def test_six_or_seven_fields_explain_that_seconds_are_not_supported(spec: str) -> None:
    with pytest.raises(CronError) as caught:
        parse(spec)
    message = str(caught.value)
    assert "seconds" in message and "not supported" in message
    assert "a worker, not a schedule" in message
    assert caught.value.field is None and caught.value.token == spec


@pytest.mark.parametrize("spec", ["* * * *", "0 0", "*", "1 2 3 4 5 6 7 8"])
def test_wrong_field_counts(spec: str) -> None:
    count = len(spec.split())
    with pytest.raises(CronError, match=f"has {count} fields?; a cron spec has five"):
        parse(spec)


@pytest.mark.parametrize("spec", ["", "   ", "\t\n"])
def test_empty_spec(spec: str) -> None:
    with pytest.raises(CronError, match="empty cron spec"):
        parse(spec)


@pytest.mark.parametrize("spec", ["0 0 1, 15 * *", "0 0 1 ,15 * *", "0 0 1 , 15 * *"])
def test_spaces_in_a_list_are_explained_rather_than_counted_as_fields(spec: str) -> None:
    with pytest.raises(CronError, match="space next to a comma"):
        parse(spec)


def test_reboot_is_refused_with_a_reason() -> None:
    with pytest.raises(CronError, match="@reboot is not supported: it means") as caught:
        parse("@reboot")
    assert caught.value.token == "@reboot"


@pytest.mark.parametrize("spec", ["@every", "@every 5m", "@minutely", "@", "@daily *"])
def test_unknown_macros(spec: str) -> None:
    with pytest.raises(CronError, match="allowed macros: @yearly @annually") as caught:
        parse(spec)
    assert caught.value.token == spec


def test_non_string_spec_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        parse(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec",
    [
        "0 0 * * fri-sun",  # a day-of-week range ending at Sunday ends at 7
        "0 0 * * 5-0",
        "0 0 * * 0-7",
        "0 0 * * 7",
        "0 0 * * MON-fri",
        "0 0 1 Jan-Mar *",
        "00 09 01 01 *",  # leading zeros are plain numbers
        "3-3 * * * *",
        "*/1000 * * * *",  # a step larger than the field keeps only the start
        "0 0 30 2 *",  # never fires, but parses: next() is None
    ],
)
def test_valid_edge_forms_parse(spec: str) -> None:
    parse(spec)
