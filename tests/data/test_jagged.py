import pytest
import torch

from haloflow.data.jagged import ClickBatch, JaggedBatch, split_sizes
from haloflow.errors import ConfigError

# The example of the module docstring: T = 2 features, B = 3 samples.
BAGS = [[[7], [1, 4], []], [[3], [3], [9, 2, 5]]]


@pytest.fixture
def jb() -> JaggedBatch:
    return JaggedBatch(torch.tensor([[1, 2, 0], [1, 1, 3]]), torch.tensor([7, 1, 4, 3, 3, 9, 2, 5]))


def test_sizes_and_offsets(jb):
    assert (jb.num_features, jb.batch_size) == (2, 3)
    assert jb.offsets().tolist() == [0, 1, 3, 3, 4, 5, 8]
    assert jb.feature_offsets().tolist() == [0, 3, 8]
    assert jb.bag_offsets().tolist() == [[0, 1, 3, 3], [0, 1, 2, 5]]


def test_feature_views(jb):
    lengths, values = jb.feature(0)
    assert lengths.tolist() == [1, 2, 0] and values.tolist() == [7, 1, 4]
    lengths, values = jb.feature(1)
    assert lengths.tolist() == [1, 1, 3] and values.tolist() == [3, 3, 9, 2, 5]
    with pytest.raises(IndexError, match="feature 2 out of range"):
        jb.feature(2)


def test_from_lists_and_to_lists_round_trip(jb):
    built = JaggedBatch.from_lists(BAGS)
    assert torch.equal(built.lengths, jb.lengths) and torch.equal(built.values, jb.values)
    assert jb.to_lists() == BAGS


def test_split_batch_counts_and_sizes(jb):
    first, second = jb.split_batch(2)  # 3 samples -> 2 + 1
    assert first.to_lists() == [[[7], [1, 4]], [[3], [3]]]
    assert second.to_lists() == [[[]], [[9, 2, 5]]]
    parts = jb.split_batch([0, 1, 2])
    assert [p.batch_size for p in parts] == [0, 1, 2]
    assert parts[0].values.numel() == 0
    assert parts[1].to_lists() == [[[7]], [[3]]]
    assert parts[2].to_lists() == [[[1, 4], []], [[3], [9, 2, 5]]]
    with pytest.raises(ConfigError, match="sum to the batch size 3"):
        jb.split_batch([1, 1])


def test_cat_inverts_split(jb):
    for k in (1, 2, 3):
        back = JaggedBatch.cat(jb.split_batch(k))
        assert torch.equal(back.lengths, jb.lengths) and torch.equal(back.values, jb.values)


def test_split_sizes_matches_tensor_split():
    for b, k in [(10, 3), (3, 4), (8, 2), (0, 2)]:
        expected = [len(x) for x in torch.tensor_split(torch.arange(b), k)]
        assert split_sizes(b, k) == expected
    with pytest.raises(ConfigError, match="k_parts must be >= 1"):
        split_sizes(4, 0)


def test_from_dense_is_one_id_per_bag():
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])  # (B=2, T=3)
    jb = JaggedBatch.from_dense(ids)
    assert jb.lengths.tolist() == [[1, 1], [1, 1], [1, 1]]
    assert jb.values.tolist() == [5, 8, 6, 9, 7, 10]  # feature-major
    assert jb.to_lists() == [[[5], [8]], [[6], [9]], [[7], [10]]]


def test_validation_messages():
    with pytest.raises(ConfigError, match="lengths sum to 3 but values has 2 ids"):
        JaggedBatch(torch.tensor([[1, 2]]), torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="must be int64"):
        JaggedBatch(torch.tensor([[1]], dtype=torch.int32), torch.tensor([1]))
    with pytest.raises(ConfigError, match="2-D"):
        JaggedBatch(torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(ConfigError, match="negative length"):
        JaggedBatch(torch.tensor([[2, -1]]), torch.tensor([1]))


def test_click_batch_split_keeps_rows_together(jb):
    dense = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    labels = torch.tensor([1.0, 0.0, 1.0])
    parts = ClickBatch(dense, jb, labels).split_batch(2)
    assert [p.batch_size for p in parts] == [2, 1]
    assert torch.equal(parts[1].dense, dense[2:]) and parts[1].labels.tolist() == [1.0]
    assert parts[1].sparse.to_lists() == [[[]], [[9, 2, 5]]]
