"""Cron specs the parser refuses, one per error form, with what the message must name.

Shared by tests/test_cron_errors.py (the message) and tests/faults/test_bad_input.py (nothing is
written when a user module declares one).
"""

from __future__ import annotations

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
