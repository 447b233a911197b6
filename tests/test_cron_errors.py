"""Every error form: CronError (a ValueError) naming the field, the token and what is allowed."""

from __future__ import annotations

import pytest
from support.cron_spec_errors import FIELD_ERRORS

from scheduling_core.cron import CronError, parse


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
        parse(5)


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
