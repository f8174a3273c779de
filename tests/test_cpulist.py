"""The one CPU-list formatter and parser (kernel list format, QEMU runs), on fixed data."""

import pytest

from virtlab.cpulist import cpu_runs, format_cpu_list, parse_cpu_list


@pytest.mark.parametrize(
    ("ids", "runs", "text"),
    [
        ([], [], ""),
        ([0], ["0"], "0"),
        ([7], ["7"], "7"),
        ([0, 1], ["0-1"], "0-1"),
        ([0, 1, 2, 3], ["0-3"], "0-3"),
        ([0, 2, 3], ["0", "2-3"], "0,2-3"),  # non-contiguous: not "0-3"
        ([0, 2, 4], ["0", "2", "4"], "0,2,4"),
        ([5, 0, 1, 2, 3], ["0-3", "5"], "0-3,5"),  # unsorted in, sorted out
        ([3, 3, 1, 2, 2], ["1-3"], "1-3"),  # repeats count once
        ([1, 2, 4, 5, 9], ["1-2", "4-5", "9"], "1-2,4-5,9"),
        ([10, 11, 12, 14, 100], ["10-12", "14", "100"], "10-12,14,100"),
    ],
)
def test_runs_and_list(ids: list[int], runs: list[str], text: str) -> None:
    assert cpu_runs(ids) == runs
    assert format_cpu_list(ids) == text
    assert parse_cpu_list(text) == tuple(sorted(set(ids)))


def test_runs_take_any_iterable() -> None:
    assert cpu_runs(iter([4, 3])) == ["3-4"]
    assert format_cpu_list(range(0, 64, 3)).startswith("0,3,6,")
    assert parse_cpu_list(format_cpu_list(range(0, 64, 3))) == tuple(range(0, 64, 3))


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("", ()),
        ("  \n", ()),
        ("0", (0,)),
        ("0-3", (0, 1, 2, 3)),
        ("0-3,5", (0, 1, 2, 3, 5)),
        (" 1 , 3 ", (1, 3)),
        ("5,0-1", (0, 1, 5)),
        ("0-7:2", (0, 2, 4, 6)),
        ("1-9:4", (1, 5, 9)),
        ("2-2", (2,)),
        ("0-1,1-2", (0, 1, 2)),
        ("0,,2", (0, 2)),
        ("3:2", (3,)),
    ],
)
def test_parse(text: str, ids: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == ids


@pytest.mark.parametrize("text", ["x", "-1", "3-1", "0-4:0", "0-4:-1", "a-b", "0-3:x", "1,2-x"])
def test_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a CPU list") as raised:
        parse_cpu_list(text)
    assert repr(text) in str(raised.value)


def test_parse_names_the_bad_range() -> None:
    with pytest.raises(ValueError, match=r"bad range '3-1'"):
        parse_cpu_list("0,3-1")
    with pytest.raises(ValueError, match=r"expected e\.g\. '0-3,5'"):
        parse_cpu_list("0,x")
