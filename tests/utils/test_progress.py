import io

from haloflow.utils.progress import progress_bar


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_quiet_when_not_a_tty_but_still_counts(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    bar = progress_bar(range(5), desc="x")
    assert list(bar) == list(range(5)) and bar.disable
    assert err.getvalue() == ""


def test_drawn_on_a_tty_unless_disabled(monkeypatch):
    err = _Tty()
    monkeypatch.setattr("sys.stderr", err)
    with progress_bar(total=3, desc="stage", leave=True) as bar:
        bar.update(3)
    assert "stage" in err.getvalue() and "3/3" in err.getvalue()
    assert progress_bar(total=3, enabled=False).disable
