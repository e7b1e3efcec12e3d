import pytest
import torch

from haloflow.errors import ConfigError
from haloflow.models.tgn_memory import MemoryRows, MemoryUpdate, TGNMemoryState


def _rows(values, eids, m=2, f=1):
    """Rows whose every field is filled from ``values[i]`` (so a row's origin is visible), mail_eid = eids[i]."""
    v = torch.tensor(values, dtype=torch.float32)
    return MemoryRows(
        memory=v[:, None].repeat(1, m), last_update=v.double(), mail_other=-v[:, None].repeat(1, m),
        mail_feat=v[:, None].repeat(1, f), mail_t=v.double() + 0.5, mail_eid=torch.tensor(eids),
    )


def test_new_state_is_empty():
    s = TGNMemoryState(4, 3, 2)
    rows = s.gather(torch.tensor([0, 3]))
    assert rows.memory.shape == (2, 3) and rows.mail_feat.shape == (2, 2)
    assert (rows.mail_eid == -1).all() and rows.memory.abs().sum() == 0
    assert rows.last_update.dtype == torch.float64 and rows.mail_t.dtype == torch.float64
    assert "0 pending messages" in repr(s)


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]])
def test_apply_keeps_the_newest_event_per_row_whatever_the_order(order):
    # Row 2 gets three writes (events 5, 9, 3): event 9's wins. Row 0 one write.
    rows = torch.tensor([2, 0, 2, 2])
    upd = _rows([1.0, 2.0, 3.0, 4.0], [5, 7, 9, 3])
    perm = torch.tensor(order)
    s = TGNMemoryState(4, 2, 1)
    s.apply(rows[perm], MemoryRows(*(getattr(upd, k)[perm] for k in upd.__dataclass_fields__)))
    assert s.mail_eid.tolist() == [7, -1, 9, -1]
    assert s.memory[:, 0].tolist() == [2.0, 0.0, 3.0, 0.0]
    assert s.mail_other[2].tolist() == [-3.0, -3.0] and s.mail_feat[2].tolist() == [3.0]
    assert s.last_update.tolist() == [2.0, 0.0, 3.0, 0.0] and s.mail_t[2].item() == 3.5


def test_updates_from_several_senders_concatenate():
    a = MemoryUpdate(torch.tensor([1]), _rows([1.0], [4]))
    b = MemoryUpdate(torch.tensor([1, 0]), _rows([2.0, 3.0], [2, 6]))
    both = MemoryUpdate.cat([a, b])
    s = TGNMemoryState(2, 2, 1)
    s.apply(both.node_ids, both.rows)
    assert s.mail_eid.tolist() == [6, 4] and s.memory[1, 0].item() == 1.0


def test_gather_copies_reset_and_clone():
    s = TGNMemoryState(3, 2, 1)
    s.apply(torch.tensor([1]), _rows([5.0], [0]))
    got = s.gather(torch.tensor([1]))
    got.memory.add_(1.0)
    assert s.memory[1, 0].item() == 5.0  # gathered rows are copies
    c = s.clone()
    s.reset()
    assert s.memory.abs().sum() == 0 and (s.mail_eid == -1).all() and s.last_update.sum() == 0
    assert c.memory[1, 0].item() == 5.0 and c.mail_eid[1].item() == 0


def test_apply_errors():
    s = TGNMemoryState(3, 2, 1)
    with pytest.raises(ConfigError, match=r"rows must have shape \(2,\) like the update"):
        s.apply(torch.tensor([0]), _rows([1.0, 2.0], [0, 1]))
    with pytest.raises(ConfigError, match="rows of width M=2, F=1 expected"):
        s.apply(torch.tensor([0]), _rows([1.0], [0], m=3))
    with pytest.raises(ConfigError, match="memory_dim >= 1"):
        TGNMemoryState(3, 0)
