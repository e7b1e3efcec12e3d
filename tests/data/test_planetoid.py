import os
import pickle
from collections import defaultdict

import numpy as np
import pytest
import scipy.sparse as sp

from haloflow.data.graph import CSRGraph
from haloflow.data.planetoid import load_restricted_pickle, read_planetoid
from haloflow.data.readers import read_dataset
from haloflow.errors import ConfigError, InputFormatError

NUM_TRAIN, NUM_ALL, F, C = 3, 510, 4, 3
TEST_IDS = [512, 510, 513]  # unsorted, and id 511 never listed (CiteSeer's isolated test nodes)


def write_pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def make_planetoid(folder, rng, name="citeseer", **override):
    """A small Planetoid set in the ``ind.<name>.*`` layout; returns the arrays it wrote."""
    folder.mkdir(parents=True, exist_ok=True)
    allx = rng.integers(0, 2, size=(NUM_ALL, F)).astype(np.float32)
    labels = rng.integers(0, C, size=NUM_ALL)
    ally = np.eye(C, dtype=np.int32)[labels]
    ally[5] = 0  # a node without a label
    tx = rng.integers(0, 2, size=(len(TEST_IDS), F)).astype(np.float32) + 10  # distinguishable from allx
    ty = np.eye(C, dtype=np.int32)[[2, 0, 1]]
    n = max(TEST_IDS) + 1
    graph = defaultdict(list)
    for u, v in rng.integers(0, n, size=(40, 2)):
        graph[int(u)].append(int(v))
    graph[7].extend([7, 8, 8])  # a self-loop and a duplicate
    objects = {
        "x": sp.csr_matrix(allx[:NUM_TRAIN]), "y": ally[:NUM_TRAIN], "allx": sp.csr_matrix(allx), "ally": ally,
        "tx": sp.csr_matrix(tx), "ty": ty, "graph": graph,
    }
    objects.update(override)
    for key, obj in objects.items():
        write_pickle(folder / f"ind.{name}.{key}", obj)
    (folder / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in TEST_IDS))
    return objects


def test_read_planetoid_places_test_rows_by_hand(tmp_path, rng):
    objs = make_planetoid(tmp_path, rng)
    ds = read_planetoid(tmp_path, name="citeseer")
    assert ds.num_nodes == 514 and ds.num_classes == C and ds.name == "citeseer"
    allx, tx = objs["allx"].toarray(), objs["tx"].toarray()
    np.testing.assert_array_equal(ds.features[:NUM_ALL], allx)
    for row, node in enumerate(TEST_IDS):  # tx row i belongs to node test.index[i]
        np.testing.assert_array_equal(ds.features[node], tx[row])
    np.testing.assert_array_equal(ds.features[511], np.zeros(F))
    np.testing.assert_array_equal(ds.labels[TEST_IDS], [2, 0, 1])
    assert ds.labels[511] == -1 and ds.labels[5] == -1
    np.testing.assert_array_equal(ds.labels[:5], objs["ally"][:5].argmax(1))
    np.testing.assert_array_equal(np.flatnonzero(ds.train_mask), np.arange(NUM_TRAIN))
    np.testing.assert_array_equal(np.flatnonzero(ds.val_mask), np.arange(NUM_TRAIN, NUM_TRAIN + 500))
    np.testing.assert_array_equal(np.flatnonzero(ds.test_mask), sorted(TEST_IDS))
    src = np.repeat(list(objs["graph"].keys()), [len(v) for v in objs["graph"].values()])
    dst = np.concatenate(list(objs["graph"].values()))
    expected = CSRGraph.from_edges(src, dst, 514, symmetrize=True, drop_self_loops=True)
    assert ds.graph.equals(expected)
    assert read_dataset(tmp_path).graph.equals(expected)  # auto-detected, name taken from ind.citeseer.x


def test_read_dataset_picks_a_set_by_name_in_a_folder_of_several(tmp_path, rng):
    make_planetoid(tmp_path, rng, name="citeseer")
    make_planetoid(tmp_path, rng, name="cora")
    assert read_dataset(tmp_path, name="cora").name == "cora"
    assert read_dataset(tmp_path, format="planetoid", name="citeseer").name == "citeseer"
    with pytest.raises(ConfigError, match=r"holds Planetoid sets \['citeseer', 'cora'\]: pass name= \(--name\)"):
        read_dataset(tmp_path)
    with pytest.raises(ConfigError, match=r"holds no Planetoid set 'pubmed' \(no ind.pubmed.x\): expected one of "
                                          r"\['citeseer', 'cora'\]"):
        read_dataset(tmp_path, name="pubmed")


@pytest.mark.slow  # importing torch_geometric takes several seconds
def test_read_planetoid_matches_pyg_loader(tmp_path, rng):
    read_planetoid_data = pytest.importorskip("torch_geometric.io").read_planetoid_data
    make_planetoid(tmp_path, rng)
    ours, pyg = read_planetoid(tmp_path, "citeseer"), read_planetoid_data(str(tmp_path), "citeseer")
    np.testing.assert_array_equal(ours.features, pyg.x.numpy())
    labelled = ours.labels >= 0  # PyG gives rows without a label class 0; we give -1
    np.testing.assert_array_equal(ours.labels[labelled], pyg.y.numpy()[labelled])
    for key in ("train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(ours, key), getattr(pyg, key).numpy())
    # PyG keeps the dict's direction (the real files list both directions, so Cora agrees unsymmetrised);
    # this random dict does not, so symmetrise PyG's edges before comparing.
    ei = pyg.edge_index.numpy()
    assert ours.graph.equals(CSRGraph.from_edges(ei[0], ei[1], pyg.num_nodes, symmetrize=True))


@pytest.mark.slow  # imports torch_geometric for the oracle
def test_read_planetoid_real_cora(shared_data):
    ds = read_planetoid(shared_data / "planetoid", "cora")
    assert ds.num_nodes == 2_708 and ds.graph.num_edges == 10_556
    assert ds.features.shape == (2_708, 1_433) and ds.num_classes == 7
    assert (ds.train_mask.sum(), ds.val_mask.sum(), ds.test_mask.sum()) == (140, 500, 1_000)
    src, dst = ds.graph.edges()
    assert not (src == dst).any() and ds.graph.equals(ds.graph.transpose())
    assert (ds.labels >= 0).all() and set(np.unique(ds.features)) == {0.0, 1.0}
    # Against PyG's loader on the same files (it unpickles without restriction; fine for this trusted data).
    read_planetoid_data = pytest.importorskip("torch_geometric.io").read_planetoid_data
    pyg = read_planetoid_data(str(shared_data / "planetoid"), "cora")
    np.testing.assert_array_equal(ds.features, pyg.x.numpy())
    np.testing.assert_array_equal(ds.labels, pyg.y.numpy())
    np.testing.assert_array_equal(ds.test_mask, pyg.test_mask.numpy())
    ei = pyg.edge_index.numpy()
    assert ds.graph.equals(CSRGraph.from_edges(ei[0], ei[1], pyg.num_nodes))


class _Reduce:
    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return (self.func, (self.arg,))


@pytest.mark.parametrize("kind", ["handwritten_os_system", "reduce_os_system", "builtins_eval"])
def test_restricted_unpickler_refuses_code(tmp_path, kind):
    marker = tmp_path / "ran"
    command = f"touch {marker}"
    if kind == "handwritten_os_system":
        payload = b"cos\nsystem\n(S'" + command.encode() + b"'\ntR."
        refused = "os.system"
    elif kind == "reduce_os_system":
        payload = pickle.dumps(_Reduce(os.system, command), protocol=2)
        refused = f"{os.system.__module__}.system"
    else:
        payload = pickle.dumps(_Reduce(eval, f"open({str(marker)!r}, 'w')"), protocol=2)
        refused = "eval"
    evil = tmp_path / "ind.cora.graph"
    evil.write_bytes(payload)
    with pytest.raises(InputFormatError, match=f"ind.cora.graph: refusing to unpickle .*{refused}: a Planetoid file"):
        load_restricted_pickle(evil)
    assert not marker.exists()
    # The payload is live: plain pickle runs it (it only creates the marker file under tmp_path).
    pickle.loads(payload, encoding="latin1")
    assert marker.exists()


def test_restricted_unpickler_refuses_code_inside_read_planetoid(tmp_path, rng):
    marker = tmp_path / "ran"
    make_planetoid(tmp_path, rng, name="cora", graph=_Reduce(os.system, f"touch {marker}"))
    with pytest.raises(InputFormatError, match="ind.cora.graph: refusing to unpickle"):
        read_planetoid(tmp_path, "cora")
    assert not marker.exists()


def test_restricted_unpickler_loads_allowed_objects(tmp_path):
    path = tmp_path / "ok.pkl"
    objs = {"m": sp.coo_matrix(np.eye(3)), "lil": sp.lil_matrix(np.eye(2)), "a": np.arange(4), "d": defaultdict(list)}
    write_pickle(path, objs)
    got = load_restricted_pickle(path)
    np.testing.assert_array_equal(got["m"].toarray(), np.eye(3))
    np.testing.assert_array_equal(got["lil"].toarray(), np.eye(2))
    np.testing.assert_array_equal(got["a"], np.arange(4))
    garbage = tmp_path / "garbage.pkl"
    garbage.write_bytes(b"\x80\x02not a pickle")
    with pytest.raises(InputFormatError, match="garbage.pkl: not a readable pickle"):
        load_restricted_pickle(garbage)


@pytest.mark.parametrize(
    "override, file, match",
    [
        ({"ty": np.eye(C, dtype=np.int32)[[0, 1]]}, "ind.citeseer.tx", "3 rows but ind.citeseer.ty has 2"),
        ({"tx": sp.csr_matrix(np.ones((3, F + 1)))}, "ind.citeseer.tx", "5 columns but ind.citeseer.allx has 4"),
        ({"graph": [1, 2]}, "ind.citeseer.graph", "expected a dict of adjacency lists, found list"),
        ({"graph": {0: [600]}}, "ind.citeseer.graph", r"node id 600 is out of range: expected ids in \[0, 514\)"),
        ({"y": np.zeros((1, C)), "x": sp.csr_matrix(np.zeros((1, F))), "allx": sp.csr_matrix(np.zeros((100, F))),
          "ally": np.zeros((100, C))}, "ind.citeseer.allx", "the standard split needs len"),
        ({"ally": "text"}, "ind.citeseer.ally", "expected a 2-D matrix, found str"),
    ],
)
def test_read_planetoid_inconsistent_files(tmp_path, rng, override, file, match):
    make_planetoid(tmp_path, rng, **override)
    with pytest.raises(InputFormatError, match=match) as info:
        read_planetoid(tmp_path, "citeseer")
    assert info.value.path.endswith(file)


def test_read_planetoid_bad_test_index_and_missing_files(tmp_path, rng):
    make_planetoid(tmp_path, rng)
    index = tmp_path / "ind.citeseer.test.index"
    index.write_text("512\nfive\n513\n")
    with pytest.raises(InputFormatError, match="test.index:2: non-integer token 'five'"):
        read_planetoid(tmp_path, "citeseer")
    index.write_text("512\n3\n513\n")
    with pytest.raises(InputFormatError, match="test.index:2: test id 3 overlaps the allx rows: expected ids >= 510"):
        read_planetoid(tmp_path, "citeseer")
    index.write_text("512\n512\n513\n")
    with pytest.raises(InputFormatError, match="test id 512 is listed 2 times"):
        read_planetoid(tmp_path, "citeseer")
    (tmp_path / "ind.citeseer.ty").unlink()
    with pytest.raises(FileNotFoundError, match="'citeseer' is incomplete: missing .*ind.citeseer.ty"):
        read_planetoid(tmp_path, "citeseer")
    with pytest.raises(FileNotFoundError, match="ind.pubmed.x"):
        read_planetoid(tmp_path, "pubmed")


def test_a_sparse_matrix_with_indices_outside_its_shape_is_an_error_not_a_crash(tmp_path, rng):
    """A pickle restores a CSR matrix's arrays as stored; scipy's toarray would write outside the array."""
    bad = sp.csr_matrix(np.eye(NUM_ALL, F, dtype=np.float32))
    bad.indices[0] = 10**6  # as a flipped byte leaves it
    make_planetoid(tmp_path, rng, allx=bad)
    with pytest.raises(InputFormatError, match=r"ind.citeseer.allx: a corrupt sparse matrix"):
        read_planetoid(tmp_path, name="citeseer")


@pytest.mark.parametrize("graph", [{"a": [1]}, {0: ["x"]}, {1.5: [2]}])
def test_an_adjacency_dict_without_integer_ids_is_an_error(tmp_path, rng, graph):
    make_planetoid(tmp_path, rng, graph=graph)
    with pytest.raises(InputFormatError, match=r"ind.citeseer.graph: expected integer node ids"):
        read_planetoid(tmp_path, name="citeseer")
