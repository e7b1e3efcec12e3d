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

Several blocks of rows (``forward_blocks``: the parts of a graph one process hosts) run layer by layer side by
side, each block in its own products and with its own views of the weights, so that a block computes the same
floats whichever blocks sit beside it (a matrix product gives a row other bits at another number of rows)::

    blocks b0, b1          h_b0 ──drop──> @W(view 0) ──┐           ┌──> +b(view 0) ──> ...
                           h_b1 ──drop──> @W(view 1) ──┴─ agg ─────┴──> +b(view 1) ──> ...
                                                   (one aggregate_blocks: each block's halo from the others)

Shapes:
    x: (n_own, in_dim); node_ids: int64 (n_own,) global ids; logits: (n_own, out_dim).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

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
        self._cache: list[torch.Tensor] | None = None  # per block (n_b, in_dim) = agg.aggregate(0, x), no grad
        self._cache_key: tuple | None = None

    # ------------------------------------------------------------------------------------------------ layer 0
    def precompute(self, x: torch.Tensor, agg: Aggregator) -> None:
        """Cache ``agg.aggregate(0, x)`` (no grad) for layer 0; `forward` with the same x and agg reuses it."""
        self.precompute_blocks([x], agg)

    def precompute_blocks(self, xs: Sequence[torch.Tensor], agg: Aggregator) -> None:
        """`precompute` for blocks of rows (see `forward_blocks`)."""
        _check_agg(agg, self.config)
        with torch.no_grad():
            self._cache = _aggregate(agg, 0, list(xs))  # [(n_b, in_dim)]
        self._cache_key = _key(xs, agg)

    def _first_inputs(self, xs: Sequence[torch.Tensor], agg: Aggregator) -> list[torch.Tensor]:
        if self._cache is None or self._cache_key != _key(xs, agg):
            log.debug("precomputing layer 0's aggregation of the input features")
            self.precompute_blocks(xs, agg)
        return self._cache

    # ------------------------------------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, agg: Aggregator, node_ids: torch.Tensor, epoch: int) -> torch.Tensor:
        """Logits (n_own, out_dim) of the rows ``x`` (n_own, in_dim) with global ids ``node_ids``."""
        return self.forward_blocks([x], agg, [node_ids], epoch)[0]

    def forward_blocks(self, xs: Sequence[torch.Tensor], agg: Aggregator, node_ids: Sequence[torch.Tensor],
                       epoch: int, *, params: Sequence[Sequence[torch.Tensor]] | None = None) -> list[torch.Tensor]:
        """`forward` on several blocks of rows, each computed on its own (its own products, in its own shapes),
        layer by layer, so that a block's floats never depend on the blocks beside it.

        Args:
            xs / node_ids: the blocks' rows (n_b, in_dim) and their global ids (n_b,).
            agg: with more than one block, a `BlockAggregator` (``aggregate_blocks(layer, hs)``).
            params: per block, its own views of ``self.parameters()`` in that order (``engine.logical.fanout``
                makes them: a weight's gradient is then a fixed sum of the blocks' gradients); None: the parameters
                themselves for every block.

        Returns:
            the blocks' logits, [(n_b, out_dim)].
        """
        cfg, n = self.config, len(xs)
        for x, ids in zip(xs, node_ids, strict=True):
            if x.dim() != 2 or x.shape[1] != cfg.in_dim or ids.shape != (x.shape[0],):
                raise ConfigError(f"GCN expects x (n, {cfg.in_dim}) and node_ids (n,), got {tuple(x.shape)} and "
                                  f"{tuple(ids.shape)}")
        views = [self._unpack(p) for p in params] if params is not None else [self._unpack(self.parameters())] * n
        if len(views) != n:
            raise ConfigError(f"forward_blocks: {n} blocks but parameter views for {len(views)}")

        def drop(t: torch.Tensor, b: int, layer: int, stream: int = 0, relu: bool = False) -> torch.Tensor:
            return keyed_dropout(t, node_ids[b], p=cfg.dropout, seed=cfg.seed, epoch=epoch,
                                 layer=layer * _STREAMS + stream, training=self.training, relu=relu)

        _check_agg(agg, cfg)
        hs = list(xs)
        blocks = range(n)
        for layer in range(cfg.num_layers):
            w = [views[b][0][layer] for b in blocks]
            bias = [views[b][2][layer] for b in blocks]
            sw = [views[b][1][layer] for b in blocks] if self.self_weights is not None else None
            if layer == 0 and cfg.precompute_first:
                first = self._first_inputs(xs, agg)
                # (n_b, hidden) = drop(A X) @ W0 + b0; in place: no second 4nF-byte buffer to fault in
                outs = [(drop(first[b], b, 0, stream=1) @ w[b]).add_(bias[b]) for b in blocks]
                if sw is not None:
                    outs = [outs[b] + drop(xs[b], b, 0) @ sw[b] for b in blocks]
            else:
                # (n_b, d_l) = drop(relu(h)): one pass, one saved mask; layer 0 (Kipf's form): drop(X), no relu
                hd = [drop(hs[b], b, layer, relu=layer > 0) for b in blocks]
                if cfg.transform_first(layer):
                    agged = _aggregate(agg, layer, [hd[b] @ w[b] for b in blocks])
                    outs = [agged[b].add_(bias[b]) for b in blocks]  # (n_b, d_l+1)
                else:
                    agged = _aggregate(agg, layer, hd)
                    outs = [(agged[b] @ w[b]).add_(bias[b]) for b in blocks]  # (n_b, d_l+1)
                if sw is not None:
                    outs = [outs[b] + hd[b] @ sw[b] for b in blocks]
            hs = outs  # pre-activation; the next layer applies relu fused with its dropout
        return hs  # [(n_b, out_dim)]

    def _unpack(self, flat) -> tuple[list, list | None, list]:
        """``self.parameters()`` order (weights, self weights when GraphSAGE, biases) -> the three per-layer lists."""
        flat, n = list(flat), self.config.num_layers
        if len(flat) != (3 if self.self_weights is not None else 2) * n:
            raise ConfigError(f"expected views of the model's {len(list(self.parameters()))} parameters, got {len(flat)}")
        sw = flat[n:2 * n] if self.self_weights is not None else None
        return flat[:n], sw, flat[-n:]

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


def _key(xs: Sequence[torch.Tensor], agg: Aggregator) -> tuple:
    # Identifies "the same input": storage, shape and version of every block, and the aggregator object.
    return (tuple((x.data_ptr(), tuple(x.shape), x._version) for x in xs), id(agg))


def _aggregate(agg: Aggregator, layer: int, hs: list[torch.Tensor]) -> list[torch.Tensor]:
    """One block: ``agg.aggregate``; several: ``agg.aggregate_blocks`` (every block's halo in one exchange)."""
    if len(hs) == 1:
        return [agg.aggregate(layer, hs[0])]
    return list(agg.aggregate_blocks(layer, hs))


def _check_agg(agg: Aggregator, cfg: GCNConfig) -> None:
    norm = getattr(agg, "norm", None)
    if norm is not None and norm != cfg.norm:
        raise ConfigError(f"conv={cfg.conv!r} needs an aggregator with norm={cfg.norm!r}, got norm={norm!r}")
