"""minitensor.flags: the shared flag checks, here DashValueParser's hint for a value that starts with '-'."""
import pytest

from minitensor.flags import DashValueParser, at_most, bad_flag


def parser():
    p = DashValueParser(prog="prog")
    p.add_argument("--link")
    p.add_argument("-o", "--out")
    return p


def error_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_value_starting_with_a_dash_is_told_to_attach(capsys):
    assert error_line(["--link", "-1,1e-9"], capsys) == ("prog: error: argument --link: expected one argument "
                                                         "(a value starting with '-' must be attached: --link=-1,1e-9)")
    assert error_line(["-o", "-x.png"], capsys).endswith("must be attached: -o=-x.png)")


def test_attached_it_parses_and_a_missing_value_gets_no_hint(capsys):
    assert parser().parse_args(["--link=-1,1e-9"]).link == "-1,1e-9"
    assert error_line(["--link"], capsys) == "prog: error: argument --link: expected one argument"


def test_at_most_names_its_bound():
    class Args:
        devices = 10**9
    assert bad_flag(Args, {"devices": at_most(10**6)}) == "--devices=1000000000 must be ≤ 1,000,000"
