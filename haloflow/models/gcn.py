"""Full-batch GCN and GraphSAGE-mean with injected aggregation: `GCNConfig`, `GCN`, `gcn_loss`.

GCN (Kipf & Welling 2017, https://arxiv.org/abs/1609.02907), layer l with ``A_hat = D^-1/2 (A+I) D^-1/2``::

    H_{l+1} = relu(A_hat @ drop(H_l) @ W_l + b_l)            (no relu after the last layer)

GraphSAGE-mean (Hamilton et al. 2017, https://arxiv.org/abs/1706.02216)::

    H_{l+1} = relu(drop(H_l) @ W_self_l + mean_neigh(drop(H_l)) @ W_neigh_l + b_l)

Layer 0 has two forms. Kipf's (``precompute_first=False``, what PyG's ``GCNConv`` computes): dropout on the input
``X``, then aggregate and transform like any other layer. The precomputed form (``precompute_first=True``, the
default, faster): dropout acts on the aggregated features ``A_hat @ X``, so ``A_hat @ X`` of the constant input
is computed once before training (`GCN.precompute`) - a different placement of layer 0's dropout, the same model
without dropout. Both are keyed by global node id, so the math is the same whatever the number of processes.
A layer transforms first when its output is narrower than its input (fewer columns to aggregate, fewer bytes for
the engine to exchange), otherwise aggregates first; the choice depends only on the config::

    layer 0, precomputed:  X ──agg (once)──> AX ──drop──> @W0 ──+b──> relu
    layer 0, Kipf's, and
    layer l:               H ──drop──> @Wl ──agg──> +b ──> relu                 if out_dim < in_dim
                           H ──drop──> agg ──> @Wl ──> +b ──> relu              otherwise

Shapes:
    x: (n_own, in_dim); node_ids: int64 (n_own,) global ids; logits: (n_own, out_dim).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from haloflow.errors import ConfigError
from haloflow.models.config import CONVS, MAX_LAYERS, GCNConfig
from haloflow.models.aggregate import Aggregator
from haloflow.kernels.keyed_dropout import keyed_dropout

__all__ = ["GCNConfig", "GCN", "gcn_loss", "CONVS", "MAX_LAYERS"]

log = logging.getLogger(__name__)

_STREAMS = 2  # dropout key = layer * _STREAMS + stream; stream 1 = layer 0's aggregated input (GraphSAGE)


class GCN(nn.Module):
    """A stack of GCN or GraphSAGE-mean layers; neighbour aggregation comes from an `Aggregator`.

    Args:
        config: see `GCNConfig`. Weights are Glorot-uniform from a generator seeded with ``config.seed`` (the same
            on every process), biases zero.
    """

    def __init__(self, config: GCNConfig):
        super().__init__()
        self.config = config
        gen = torch.Generator().manual_seed(config.seed)
        dims = config.dims
        self.weights = nn.ParameterList(_glorot(dims[i], dims[i + 1], gen) for i in range(config.num_layers))
        self.self_weights = (
            nn.ParameterList(_glorot(dims[i], dims[i + 1], gen) for i in range(config.num_layers))
            if config.conv == "sage"
            else None
        )
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(dims[i + 1])) for i in range(config.num_layers))
        self._cache: torch.Tensor | None = None  # (n_own, in_dim) = agg.aggregate(0, x), no grad
        self._cache_key: tuple | None = None

    # ------------------------------------------------------------------------------------------------ layer 0
    def precompute(self, x: torch.Tensor, agg: Aggregator) -> None:
        """Cache ``agg.aggregate(0, x)`` (no grad) for layer 0; `forward` with the same x and agg reuses it."""
        _check_agg(agg, self.config)
        with torch.no_grad():
            self._cache = agg.aggregate(0, x)  # (n_own, in_dim)
        self._cache_key = _key(x, agg)

    def _first_input(self, x: torch.Tensor, agg: Aggregator) -> torch.Tensor:
        if self._cache is None or self._cache_key != _key(x, agg):
            log.debug("precomputing layer 0's aggregation of the input features")
            self.precompute(x, agg)
        return self._cache

    # ------------------------------------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, agg: Aggregator, node_ids: torch.Tensor, epoch: int) -> torch.Tensor:
        cfg = self.config
        if x.dim() != 2 or x.shape[1] != cfg.in_dim or node_ids.shape != (x.shape[0],):
            raise ConfigError(
                f"GCN expects x (n, {cfg.in_dim}) and node_ids (n,), got {tuple(x.shape)} and {tuple(node_ids.shape)}"
            )

        def drop(t: torch.Tensor, layer: int, stream: int = 0, relu: bool = False) -> torch.Tensor:
            return keyed_dropout(t, node_ids, p=cfg.dropout, seed=cfg.seed, epoch=epoch,
                                 layer=layer * _STREAMS + stream, training=self.training, relu=relu)

        _check_agg(agg, cfg)
        h = x
        for layer in range(cfg.num_layers):
            w, b = self.weights[layer], self.biases[layer]
            if layer == 0 and cfg.precompute_first:
                ah = drop(self._first_input(x, agg), 0, stream=1)  # (n, in_dim) = drop(A X)
                out = (ah @ w).add_(b)  # (n, hidden); in place: no second 4nF-byte buffer to fault in
                if self.self_weights is not None:
                    out = out + drop(x, 0) @ self.self_weights[0]
            else:
                # (n, d_l) = drop(relu(h)): one pass, one saved mask; layer 0 (Kipf's form): drop(X), no relu
                hd = drop(h, layer, relu=layer > 0)
                if cfg.transform_first(layer):
                    out = agg.aggregate(layer, hd @ w).add_(b)  # (n, d_l+1)
                else:
                    out = (agg.aggregate(layer, hd) @ w).add_(b)  # (n, d_l+1)
                if self.self_weights is not None:
                    out = out + hd @ self.self_weights[layer]
            h = out  # pre-activation; the next layer applies relu fused with its dropout
        return h  # (n, out_dim)

    def param_groups(self, weight_decay: float) -> list[dict]:
        """Optimizer groups with ``weight_decay`` on layer 0's weights only (Kipf & Welling's setting)."""
        first = [self.weights[0]] + ([self.self_weights[0]] if self.self_weights is not None else [])
        ids = {id(p) for p in first}
        rest = [p for p in self.parameters() if id(p) not in ids]
        return [{"params": first, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def gcn_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, num_global_train: int) -> torch.Tensor:
    """Sum of cross-entropy over the rows where ``mask`` is True, divided by the *global* training count.

    Dividing by the global count (not the local one) makes the sum of the per-rank losses equal the
    single-process mean loss, so gradients summed across ranks are exact.

    Shapes:
        logits (n, C), labels int64 (n,), mask bool (n,) -> scalar.
    """
    if num_global_train < 1:
        raise ConfigError(f"num_global_train must be >= 1, got {num_global_train}")
    if mask.shape != (logits.shape[0],) or labels.shape != (logits.shape[0],):
        raise ConfigError(
            f"labels and mask must have one entry per row of logits {tuple(logits.shape)}, "
            f"got {tuple(labels.shape)} and {tuple(mask.shape)}"
        )
    # Per-row CE with a where, not logits[mask]: boolean indexing costs a nonzero + gather + index_put in the
    # backward, as much as the rest of the loss on 200k rows. Unlabelled rows (label -1) are masked out.
    per_row = F.cross_entropy(logits, torch.where(mask, labels, 0), reduction="none")  # (n,)
    return torch.where(mask, per_row, 0.0).sum() / num_global_train


def _glorot(fan_in: int, fan_out: int, gen: torch.Generator) -> nn.Parameter:
    bound = (6.0 / (fan_in + fan_out)) ** 0.5
    return nn.Parameter((torch.rand(fan_in, fan_out, generator=gen) * 2.0 - 1.0) * bound)


def _key(x: torch.Tensor, agg: Aggregator) -> tuple:
    # Identifies "the same input": storage, shape and version of x, and the aggregator object.
    return (x.data_ptr(), tuple(x.shape), x._version, id(agg))


def _check_agg(agg: Aggregator, cfg: GCNConfig) -> None:
    norm = getattr(agg, "norm", None)
    if norm is not None and norm != cfg.norm:
        raise ConfigError(f"conv={cfg.conv!r} needs an aggregator with norm={cfg.norm!r}, got norm={norm!r}")
