"""DGL's GCN epoch as a peer of ``haloflow bench gcn`` (run by ``haloflow.bench.peer.PeerProcess``).

Runs under the Python that ``scripts/setup_peers.sh dgl`` builds (DGL 2.1 on torch 2.2.1): it imports numpy,
torch and dgl only, nothing from haloflow. Lines in and out, one JSON object each::

    in:  {"setup": {"data": "/tmp/.../gcn.npz", "dims": [128, 128, 40], "dropout": 0.0, "seed": 0, "threads": 2}}
    out: {"ready": true, "info": {"dgl": "2.1.0", "torch": "2.2.1"}}
    in:  {"cmd": "epoch"}
    out: {"seconds": 0.93, "loss": 3.71}              seconds: perf_counter around the epoch, not the pipe
    in:  {"cmd": "exit"}                              (or end of input)

Any failure answers ``{"error": "one line"}`` and exits with status 1.

The ``.npz`` holds the graph and the model's first weights, so both sides start from the same point::

    indptr   int64 (N+1,)   CSR by destination: row v lists the in-neighbours u of v, a message flows u -> v
    indices  int64 (nnz,)   (no self-loops: dgl.add_self_loop adds one per node, as A + I does)
    x        float32 (N, F) features
    y        int64 (N,)     labels
    w0, b0, w1, b1, ...     layer l's weight (d_l, d_l+1) and bias (d_l+1,): haloflow's GCN layout = GraphConv's

Model (Kipf's GCN, the same math as haloflow's ``GCN(precompute_first=False)`` and PyG's ``GCNConv``)::

    h = x;  h = GraphConv_l(g, dropout(h))  with relu between layers;  loss = mean cross-entropy over all nodes

GraphConv(norm="both") scales a message by out_degree(u)^-1/2 and in_degree(v)^-1/2; on the benchmark's
symmetric graph with self-loops those are haloflow's ``D^-1/2 (A + I) D^-1/2``.
"""

import json
import os
import sys
import time

os.environ.setdefault("DGLBACKEND", "pytorch")  # dgl picks its backend at import


def build(setup: dict):
    """One training epoch as a closure over the graph, model and optimizer that ``setup`` describes."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    try:
        import dgl
        from dgl.nn import GraphConv
    except Exception as err:  # not installed, or a wheel built for another torch (our own .venv's 2.13)
        raise RuntimeError(f"dgl does not import under {sys.executable}: {type(err).__name__}: {err}") from None

    torch.set_num_threads(int(setup["threads"]))
    torch.manual_seed(int(setup["seed"]))  # dropout's masks
    dims, p = [int(d) for d in setup["dims"]], float(setup["dropout"])
    with np.load(setup["data"]) as data:
        indptr, indices = data["indptr"], data["indices"]
        x = torch.from_numpy(data["x"])  # (N, dims[0])
        y = torch.from_numpy(data["y"]).long()  # (N,)
        weights = [(torch.from_numpy(data[f"w{i}"]), torch.from_numpy(data[f"b{i}"])) for i in range(len(dims) - 1)]
    n = len(indptr) - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))  # (nnz,): row v once per in-neighbour
    g = dgl.add_self_loop(dgl.graph((torch.from_numpy(indices.astype(np.int64)), torch.from_numpy(dst)),
                                    num_nodes=n))
    convs = torch.nn.ModuleList(GraphConv(dims[i], dims[i + 1], norm="both") for i in range(len(dims) - 1))
    with torch.no_grad():
        for conv, (w, b) in zip(convs, weights):
            if tuple(w.shape) != tuple(conv.weight.shape) or tuple(b.shape) != tuple(conv.bias.shape):
                raise ValueError(f"weights {tuple(w.shape)}, {tuple(b.shape)} do not fit GraphConv's "
                                 f"{tuple(conv.weight.shape)}, {tuple(conv.bias.shape)}")
            conv.weight.copy_(w)
            conv.bias.copy_(b)
    opt = torch.optim.Adam(convs.parameters(), lr=0.01)

    def epoch() -> dict:
        t0 = time.perf_counter()
        opt.zero_grad()
        h = x
        for i, conv in enumerate(convs):
            h = conv(g, F.dropout(h, p, training=True))  # (N, dims[i+1])
            if i < len(convs) - 1:
                h = F.relu(h)
        loss = F.cross_entropy(h, y)
        loss.backward()
        opt.step()
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "loss": loss.item()}

    info = {"dgl": dgl.__version__, "torch": torch.__version__, "nodes": n, "edges": int(g.num_edges())}
    return epoch, info


def serve() -> int:
    # Replies go to a private copy of stdout; fd 1 itself then points at stderr, so that anything dgl or torch
    # prints (from Python or from C) cannot land in the middle of the protocol.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    epoch = None
    try:
        for line in sys.stdin:
            message = json.loads(line)
            if "setup" in message:
                epoch, info = build(message["setup"])
                reply({"ready": True, "info": info})
            elif message.get("cmd") == "epoch" and epoch is not None:
                reply(epoch())
            elif message.get("cmd") == "exit":
                break
            else:
                raise ValueError(f"expected a setup, then 'epoch' or 'exit' commands, got {line.strip()[:100]!r}")
    except Exception as err:  # one line back to the benchmark, which raises it as PeerError
        reply({"error": f"{type(err).__name__}: {err}".splitlines()[0] if str(err) else type(err).__name__})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(serve())
