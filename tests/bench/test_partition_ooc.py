import json

from haloflow.bench.partition_ooc import main


def test_small_run_measures_every_contestant_and_out_of_core_cuts_as_in_memory(tmp_path, capsys):
    out = tmp_path / "ooc.json"
    assert main(["--scale", "11", "--compare-scale", "10", "--features", "4", "--parts", "4", "--budget", "1GiB",
                 "--work", str(tmp_path / "work"), "--out", str(out), "--clean"]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["label"], r["scale"]) for r in runs] == [("fennel out of core", 10), ("fennel in memory", 10),
                                                        ("metis in memory", 10), ("fennel out of core", 11)]
    assert all(r["ok"] and r["peak_rss"] > 0 and r["load_before"] for r in runs)
    assert runs[0]["edge_cut"] == runs[1]["edge_cut"] and runs[0]["entries"] == runs[1]["entries"]
    assert runs[3]["temp_peak"] > 0 and "fennel pass 4" in runs[3]["stages"]
    assert "| fennel out of core | 11 |" in capsys.readouterr().out
    assert not list((tmp_path / "work").glob("rmat-*"))
