import pytest

from haloflow.cli import main


@pytest.fixture
def cli_fails(capsys):
    """Run ``haloflow ARGV`` expecting a user error: exit 2, one stderr line, no traceback, each pattern in it."""

    def run(argv, *patterns) -> str:
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        for pattern in patterns:
            assert pattern in err, err
        return err

    return run
