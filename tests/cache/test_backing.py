import json

import pytest
import torch

from haloflow.cache import SGD, Adagrad, BackingStore, RowWiseAdagrad, uniform_rows
from haloflow.errors import ConfigError, InputFormatError, OutputExistsError


def test_uniform_rows_do_not_depend_on_how_the_table_is_cut():
    whole = uniform_rows(150_000, 2, seed=3)
    parts = torch.cat([uniform_rows(150_000, 2, seed=3, start=s, stop=min(s + 40_000, 150_000))
                       for s in range(0, 150_000, 40_000)])
    assert torch.equal(whole, parts)
    assert whole.abs().max() <= 1 / 150_000 ** 0.5
    assert not torch.equal(whole, uniform_rows(150_000, 2, seed=4))


def test_host_table_reads_and_writes_rows_with_their_state():
    b = BackingStore.in_memory(6, 2, Adagrad(initial_accumulator_value=0.25), weight=torch.arange(12.0).view(6, 2))
    rows = b.read(torch.tensor([5, 1]))
    assert rows["weight"].tolist() == [[10, 11], [2, 3]] and rows["sum"].tolist() == [[0.25, 0.25]] * 2
    b.write(torch.tensor([0]), {"weight": torch.tensor([[-1.0, -2.0]]), "sum": torch.tensor([[9.0, 9.0]])})
    assert b.arrays["weight"][0].tolist() == [-1, -2] and b.arrays["sum"][0].tolist() == [9, 9]
    assert b.row_bytes == 16 and not b.pinned  # no CUDA here


def test_a_host_table_can_keep_its_initial_weight_instead_of_a_copy():
    w = torch.arange(12.0).view(6, 2)
    kept = BackingStore.in_memory(6, 2, Adagrad(), weight=w, copy=False, pin=False)
    copied = BackingStore.in_memory(6, 2, Adagrad(), weight=w, pin=False)
    assert kept.arrays["weight"].data_ptr() == w.data_ptr() and copied.arrays["weight"].data_ptr() != w.data_ptr()
    assert torch.equal(copied.arrays["weight"], w) and kept.arrays["sum"].shape == (6, 2)
    strided = BackingStore.in_memory(6, 2, SGD(), weight=w.t().contiguous().t(), copy=False, pin=False)
    assert torch.equal(strided.arrays["weight"], w) and strided.arrays["weight"].is_contiguous()  # copied


def test_memory_mapped_table_survives_close_and_reopen(tmp_path):
    w = torch.randn(1000, 4)
    b = BackingStore.create(tmp_path / "t", 1000, 4, RowWiseAdagrad(lr=0.3), weight=w)
    b.write(torch.tensor([7, 900]), {"weight": torch.ones(2, 4), "sum": torch.tensor([2.0, 3.0])})
    b.close()
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["num_rows"] == 1000 and meta["optimizer"]["name"] == "rowwise_adagrad"
    assert meta["arrays"] == {"weight": [1000, 4], "sum": [1000]}
    c = BackingStore.open(tmp_path / "t")
    assert c.optimizer == RowWiseAdagrad(lr=0.3) and c.name == "t"
    expect = w.clone()
    expect[[7, 900]] = 1.0
    assert torch.equal(c.arrays["weight"], expect)
    assert c.read(torch.tensor([900, 7, 0]))["sum"].tolist() == [3.0, 2.0, 0.0]
    c.close()


def test_release_keeps_the_data(tmp_path):
    b = BackingStore.create(tmp_path / "t", 5000, 8, SGD(), seed=1, max_resident_bytes=4096)
    ids = torch.arange(0, 5000, 7)
    b.write(ids, {"weight": torch.full((ids.numel(), 8), 2.5)})  # past the limit: mapping dropped
    assert b._touched == 0
    assert (b.read(ids)["weight"] == 2.5).all()
    assert torch.equal(b.read(torch.tensor([1]))["weight"], uniform_rows(5000, 8, seed=1, start=1, stop=2))
    b.close()


def test_create_and_open_errors(tmp_path):
    BackingStore.create(tmp_path / "t", 10, 2, Adagrad()).close()
    with pytest.raises(OutputExistsError):
        BackingStore.create(tmp_path / "t", 10, 2, Adagrad())
    with pytest.raises(ConfigError, match=r"table 't' .* holds arrays .* optimizer 'sgd' needs"):
        BackingStore.open(tmp_path / "t", SGD())
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        BackingStore.open(tmp_path / "missing")
    with open(tmp_path / "t" / "sum.bin", "ab") as f:
        f.write(b"xxxx")
    with pytest.raises(InputFormatError, match=r"sum.bin: expected 80 bytes for sum \(10, 2\) float32, found 84"):
        BackingStore.open(tmp_path / "t")
    (tmp_path / "t" / "meta.json").write_text("{}")
    with pytest.raises(InputFormatError, match="not a haloflow-table version 1 header"):
        BackingStore.open(tmp_path / "t")
    with pytest.raises(ConfigError, match=r"table 'w': weight of shape \(3, 2\), expected \(10, 2\)"):
        BackingStore.in_memory(10, 2, SGD(), weight=torch.zeros(3, 2), name="w")


def test_write_chunk_follows_the_resident_cap(tmp_path):
    b = BackingStore.create(tmp_path / "t", 100, 2, Adagrad(), max_resident_bytes=4096 * 2 * 300)
    assert b.write_chunk == 300  # two arrays, one page each per scattered row
    assert BackingStore.in_memory(100, 2, Adagrad()).write_chunk == 1 << 16
    b.close()
