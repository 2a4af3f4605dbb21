"""The slow tier's registry in tests/conftest.py names only modules and tests that exist."""

from pathlib import Path

from tests.conftest import LONGEST_FIRST, SLOW_MODULES, SLOW_TESTS, stale_slow_entries


def test_every_slow_entry_names_a_module_or_test():
    stale = stale_slow_entries()
    assert not stale, "tests/conftest.py: " + "; ".join(stale)


def test_every_module_run_first_exists_and_is_slow():
    assert not stale_slow_entries(modules=LONGEST_FIRST, tests=())
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert set(LONGEST_FIRST) - set(SLOW_MODULES) <= {
        Path(test.split("::")[0]).stem for test in SLOW_TESTS
    }  # each holds slow tests: the fast tier's order does not depend on it


def test_a_misspelled_entry_is_named(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "def test_one():\n    pass\n\n\nclass TestGroup:\n    def test_two(self):\n        pass\n"
    )
    good = ("test_a.py::test_one", "test_a.py::TestGroup::test_two")
    assert stale_slow_entries(tmp_path, ("test_a",), good) == []
    assert stale_slow_entries(
        tmp_path, ("test_b",), ("test_a.py::test_on", "test_c.py::test_one")
    ) == [
        "SLOW_MODULES names test_b, but tests/test_b.py does not exist",
        "SLOW_TESTS names test_a.py::test_on, but tests/test_a.py defines no test_on",
        "SLOW_TESTS names test_c.py::test_one, but tests/test_c.py does not exist",
    ]
    assert SLOW_MODULES and SLOW_TESTS
