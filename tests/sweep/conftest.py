"""Print how many inputs the sweep tried per reader and command (and how many were read or refused) at the end
of the run, and keep them in pytest's cache (``.pytest_cache``, key ``haloflow/sweep_counts``)."""

import pytest

from tests.sweep.mutate import COUNTS, OUTCOMES


@pytest.fixture(scope="session")
def case_inputs(tmp_path_factory):
    """The inputs the table-driven cases (``cases.py``) start from, built once."""
    from tests.sweep.cases import build_inputs

    return build_inputs(tmp_path_factory.mktemp("issue37_inputs"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section("bad-input sweep: inputs tried")
    width = max(len(k) for k in COUNTS)
    for what in sorted(COUNTS):
        tr.write_line(f"{what:<{width}}  {COUNTS[what]:>5}  (read {OUTCOMES[what, 'ok']}, "
                      f"refused {OUTCOMES[what, 'error']})")
    tr.write_line(f"{'total':<{width}}  {sum(COUNTS.values()):>5}")
    if getattr(config, "cache", None) is not None:  # absent under -p no:cacheprovider
        config.cache.set("haloflow/sweep_counts", {k: {"tried": v, "ok": OUTCOMES[k, "ok"], "error": OUTCOMES[k, "error"]}
                                                   for k, v in sorted(COUNTS.items())})
