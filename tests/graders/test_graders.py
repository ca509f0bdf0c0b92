from __future__ import annotations

import time

import pytest

from baton_graders import Grade, extract_choice, extract_code, extract_math_answer, grade, parse_number

# ---------------------------------------------------------------- dispatch and Grade


def test_unknown_grader_is_a_clear_value_error():
    with pytest.raises(ValueError, match="unknown grader 'nope'.*math"):
        grade("nope", "a", "b")


def test_grade_rejects_scores_outside_unit_interval():
    with pytest.raises(ValueError):
        Grade(1.5, "x")
    assert Grade(1, "ok").passed and not Grade(0.0, "no").passed


# ---------------------------------------------------------------- math


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("Thus the result is \\boxed{\\frac{1}{2}}.", "0.5"),
        ("\\boxed{\\frac{1}{\\frac{1}{2}}}", "2"),  # nested braces
        ("\\boxed{\\dfrac{10}{4}}", "5/2"),
        ("So she pays 1,234 dollars.", "1234"),
        ("The total is $1,000.00.", "1000"),
        ("\\boxed{-0}", "0"),
        ("#### 42", "42"),
        ("We get 3/4 of the pie.", "0.75"),
        ("-\\frac{3}{4}", "-0.75"),
        ("The length is 12 cm.", "12"),
        ("\\boxed{12\\text{ cm}}", "12 cm"),
        ("x = \\boxed{3.50}.", "\\frac{7}{2}"),
        ("First 12 apples, then 3 pears: 15.", "15"),
        ("The answer is 7, since 3 + 4 = 7 and 10 - 3 = 7. Done in 2 steps.", "7"),
        ("The answer is 1e3", "1000"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt2}{2}"),
        ("\\boxed{x + 1}", "x+1"),
    ],
)
def test_math_accepts_equivalent_answers(answer, reference):
    result = grade("math", answer, reference)
    assert result.score == 1.0, result.detail


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("The answer is \\boxed{5}", "6"),
        ("\\boxed{0.333}", "1/3"),
        ("It is 12,345.", "1234"),
        ("I cannot solve this.", "3"),
        ("\\boxed{x + 2}", "x+1"),
        ("Answer: 3 and then some 7", "7"),  # the stated answer wins over the last number
    ],
)
def test_math_rejects_wrong_answers(answer, reference):
    assert grade("math", answer, reference).score == 0.0


def test_math_tolerance_is_opt_in():
    assert grade("math", "\\boxed{0.3333}", "1/3").score == 0.0
    assert grade("math", "\\boxed{0.3333}", "1/3", rel_tol=1e-3).score == 1.0


def test_math_extraction_priority_and_parse_number():
    assert extract_math_answer("first 1 then \\boxed{2} then 3") == ("2", "boxed")
    assert extract_math_answer("work... #### 17\nmore") == ("17", "####")
    assert extract_math_answer("4 and 5") == ("5", "last number")
    assert parse_number("-0") == 0
    assert parse_number("1,234.5") == pytest.approx(1234.5)
    assert parse_number("\\frac{6}{4}") == parse_number("1.5")
    assert parse_number("twelve") is None


# ---------------------------------------------------------------- choice


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("Let me think... The answer is (C).", "C"),
        ("Answer: C", "C"),
        ("answer: c", "C"),
        ("so the final pick is **C**", "C"),
        ("\\boxed{C}", "C"),
        ("Options A and B are wrong, so C", "C"),
        ("I think it must be C.", "C"),
        ("A careful reading rules out (A) and (B); the remaining option (C) fits.", "C"),
        ("The answer is a bit subtle, but (C)", "C"),
        ("the answer is J", "J"),
    ],
)
def test_choice_extraction(answer, letter):
    assert extract_choice(answer)[0] == letter
    assert grade("choice", answer, letter).score == 1.0
    assert grade("choice", answer, "B").score == 0.0


def test_choice_letters_are_configurable():
    assert extract_choice("The answer is (F)", letters="ABCD") == (None, "no letter found")
    assert grade("choice", "The answer is (F)", "F", letters="ABCDEF").score == 1.0
    assert grade("choice", "nothing here", "a").detail.startswith("no option letter")
    with pytest.raises(ValueError):
        grade("choice", "A", "Z", letters="ABCD")


# ---------------------------------------------------------------- exact / regex


def test_exact_normalises_whitespace_and_case():
    assert grade("exact", "  Paris\n", "paris").score == 1.0
    assert grade("exact", "New   York", "new york").score == 1.0
    assert grade("exact", "Paris", "paris", case_sensitive=True).score == 0.0
    assert grade("exact", "Lyon", "Paris").score == 0.0


def test_regex_fullmatch_and_search():
    assert grade("regex", " 2024-01-05 ", r"\d{4}-\d{2}-\d{2}").score == 1.0
    assert grade("regex", "on 2024-01-05", r"\d{4}-\d{2}-\d{2}").score == 0.0
    assert grade("regex", "on 2024-01-05", r"\d{4}-\d{2}-\d{2}", mode="search").score == 1.0
    assert grade("regex", "YES", "yes", ignore_case=True).score == 1.0
    with pytest.raises(ValueError):
        grade("regex", "x", "(unclosed")
    with pytest.raises(ValueError):
        grade("regex", "x", "x", mode="match")


# ---------------------------------------------------------------- code

ADD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"


def test_extract_code_prefers_last_python_block():
    text = "```python\nx = 1\n```\nthen\n```bash\nls\n```\n```python\ny = 2\n```"
    assert extract_code(text) == ("y = 2\n", "last python block")
    assert extract_code("```\nz = 3\n```")[1] == "last fenced block"
    assert extract_code("w = 4")[1] == "whole answer"


@pytest.mark.parametrize(
    "tests",
    [
        "assert add(1, 2) == 3",
        "def test_one():\n    assert add(2, 2) == 4\n",
        "import unittest\nclass T(unittest.TestCase):\n    def test_x(self):\n        self.assertEqual(add(1, 1), 2)\n",
        "from solution import add\nassert add(5, 5) == 10\n",
    ],
)
def test_code_passes_with_various_test_styles(tests):
    result = grade("code", ADD, tests)
    assert result.score == 1.0, result.detail


def test_code_humaneval_check_with_entry_point():
    tests = "def check(candidate):\n    assert candidate(3, 4) == 7\n"
    assert grade("code", ADD, tests, entry_point="add").score == 1.0
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    assert grade("code", bad, tests, entry_point="add").score == 0.0


def test_code_failing_test_is_reported():
    tests = "def test_ok():\n    assert add(1, 1) == 2\ndef test_bad():\n    assert add(1, 1) == 3\n"
    result = grade("code", ADD, tests)
    assert result.score == 0.0
    assert "1 failed, 1 passed" in result.detail and "test_bad" in result.detail


def test_code_syntax_error_and_missing_code():
    assert "does not compile" in grade("code", "def f(:\n  pass", "assert True").detail
    assert grade("code", "```python\n\n```", "assert True").score == 0.0


def test_code_network_is_blocked():
    code = "import socket\ns = socket.socket()\n"
    result = grade("code", code, "assert True")
    assert result.score == 0.0 and "network access is disabled" in result.detail


def test_code_process_creation_is_blocked_by_default():
    code = "import subprocess\nsubprocess.run(['true'])\n"
    result = grade("code", code, "assert True")
    assert result.score == 0.0 and "starting processes is disabled" in result.detail
    allowed = grade("code", "import os\nstatus = os.system('true')\n", "assert status == 0", block_processes=False)
    assert allowed.score == 1.0, allowed.detail


def test_code_wall_time_limit_kills_the_process_group():
    start = time.monotonic()
    result = grade("code", "import time\ntime.sleep(60)\n", "assert True", timeout=1.0)
    assert result.score == 0.0 and "timed out" in result.detail
    assert time.monotonic() - start < 10


def test_code_memory_limit():
    result = grade("code", "x = bytearray(3 * 1024 ** 3)\n", "assert True", memory_mb=512)
    assert result.score == 0.0 and "MemoryError" in result.detail


def test_code_early_exit_does_not_count_as_a_pass():
    assert grade("code", "import os\nos._exit(0)\n", "assert False").score == 0.0
    assert grade("code", "import sys\nsys.exit(0)\n", "assert False").score == 0.0


def test_code_runs_in_a_fresh_directory():
    code = "import os\ncwd = os.getcwd()\nopen('scratch.txt', 'w').write('x')\n"
    first = grade("code", code, "import os\nassert os.path.basename(cwd).startswith('baton-grade-')")
    assert first.score == 1.0, first.detail
    second = grade("code", "import os\nseen = os.path.exists('scratch.txt')\n", "assert not seen")
    assert second.score == 1.0, second.detail
