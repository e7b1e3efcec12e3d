"""A synthetic Criteo-like click log, deterministic by seed, with labels a model can actually learn.

Each sample::

    dense    d_j = log(1 + c_j), c_j = floor(LogNormal(mu_j, 1)), missing (-> 0) with prob. ``dense_missing``
    sparse   table t: a bag of ids (one id, or 1 + Poisson(m - 1) for multi-hot m), each drawn Zipf(s) over
             ``[0, rows_t)``: P(id = k) ~ (k + 1)^-s, so id 0 is the hottest row
    label    y ~ Bernoulli(sigmoid(b + signal * f)),
             f = (sum_j w_j * standardised d_j  +  sum_t mean over the bag of h_t(id)) / sqrt(F + T)
             w_j ~ N(0, 1) and h_t(id) ~ U(-sqrt 3, sqrt 3) (a hash of seed, t, id: no table is stored),
             b = logit(positive_rate)

The stream of samples is cut into fixed chunks of ``CHUNK`` rows, chunk c drawn from ``rng([seed, c])``, so
sample i is the same whatever the batch size and wherever a reader starts.

Shapes:
    batch(...) -> ClickBatch: dense (B, F) float32, sparse JaggedBatch lengths (T, B), labels (B,) float32
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from haloflow.data.criteo import KAGGLE_TABLE_SIZES
from haloflow.data.criteo_loader import SPLITS, ClickParquetWriter, is_click_folder
from haloflow.data.jagged import ClickBatch, JaggedBatch
from haloflow.errors import ConfigError
from haloflow.data.paths import check_output_parent
from haloflow.utils.atomic import atomic_directory

__all__ = ["ClickLogConfig", "ClickLogGenerator", "CHUNK"]

CHUNK = 4096  # samples per independently seeded chunk of the stream


MAX_MULTI_HOT = 1024  # mean ids per bag: far above any real feature, and far below numpy's Poisson limit


@dataclass(frozen=True, kw_only=True)
class ClickLogConfig:
    """Shape and statistics of the synthetic log.

    Args:
        table_sizes: rows per table before scaling (the 26 Kaggle cardinalities by default).
        scale: multiply every table size by this (each keeps >= 1 row), e.g. 1e-3 for a small run.
        max_rows: cap on any table's rows after scaling (None: no cap).
        num_dense: dense features per sample.
        zipf_exponent: s of the Zipf law of ids (> 0; Criteo's hot ids follow s ~ 1).
        multi_hot: mean ids per bag; 1 = one id per feature (as Criteo).
        dense_missing: probability that a dense value is missing (then 0).
        positive_rate: sets the bias of the hidden model (Criteo Kaggle clicks are ~25.6% positive).
        signal: scale of the feature part of the hidden logit; 0 makes labels pure noise.
        seed: everything random derives from it.
    """

    table_sizes: tuple[int, ...] = KAGGLE_TABLE_SIZES
    scale: float = 1.0
    max_rows: int | None = None
    num_dense: int = 13
    zipf_exponent: float = 1.05
    multi_hot: float = 1.0
    dense_missing: float = 0.2  # roughly the share of empty I fields in the real head
    positive_rate: float = 0.25
    signal: float = 2.0  # strong enough that a few hundred SGD steps learn it
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_sizes", tuple(int(s) for s in self.table_sizes))
        if not self.table_sizes or min(self.table_sizes) < 1:
            raise ConfigError(f"table_sizes must be positive, got {self.table_sizes}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ConfigError(f"scale must be a finite number > 0, got {self.scale}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if not (1 <= self.multi_hot <= MAX_MULTI_HOT):  # NaN fails too
            raise ConfigError(f"multi_hot must be in [1, {MAX_MULTI_HOT}] (mean ids per bag), got {self.multi_hot}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"max_rows must be >= 1, got {self.max_rows}")
        if self.num_dense < 1 or not self.zipf_exponent > 0 or self.multi_hot < 1:
            raise ConfigError(
                f"need num_dense >= 1, zipf_exponent > 0, multi_hot >= 1; got {self.num_dense}, "
                f"{self.zipf_exponent}, {self.multi_hot}"
            )
        if not 0 <= self.dense_missing < 1 or not 0 < self.positive_rate < 1:
            raise ConfigError(
                f"dense_missing must be in [0, 1) and positive_rate in (0, 1), got {self.dense_missing}, "
                f"{self.positive_rate}"
            )

    @property
    def sizes(self) -> tuple[int, ...]:
        """Table sizes after ``scale`` and ``max_rows``."""
        cap = self.max_rows or math.inf
        return tuple(int(min(cap, max(1, round(n * self.scale)))) for n in self.table_sizes)


def _hash_unit(keys: np.ndarray) -> np.ndarray:
    """splitmix64 of uint64 keys -> floats uniform in [0, 1)."""
    z = keys + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class ClickLogGenerator:
    """Draws samples of the log described in the module docstring."""

    def __init__(self, config: ClickLogConfig):
        self.config = config
        self.sizes = config.sizes
        F = config.num_dense
        hidden = np.random.default_rng([config.seed, 0xC11C5])
        self.dense_mu = hidden.uniform(0.0, 4.0, F)  # per-feature log-scale of the counts
        self.dense_w = hidden.standard_normal(F)
        # mean and std of d_j = log1p(floor(LogNormal(mu, 1))) with missing values, estimated once
        probe = self._dense(np.random.default_rng([config.seed, 0xD15]), 1 << 14)
        self.dense_mean, self.dense_std = probe.mean(0), probe.std(0) + 1e-6
        self.bias = math.log(config.positive_rate / (1 - config.positive_rate))
        self._last: tuple[int, ClickBatch] | None = None

    # ---------------------------------------------------------------- drawing one chunk
    def _dense(self, rng: np.random.Generator, n: int) -> np.ndarray:
        counts = np.floor(rng.lognormal(self.dense_mu, 1.0, size=(n, self.config.num_dense)))
        d = np.log1p(counts)
        d[rng.random((n, self.config.num_dense)) < self.config.dense_missing] = 0.0
        return d.astype(np.float32)  # (n, F)

    def _zipf(self, rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
        """Ids in [0, rows) with P(k) ~ (k+1)^-s, by inverting the continuous power law on [1, rows+1)."""
        s, u = self.config.zipf_exponent, rng.random(n)
        if abs(s - 1.0) < 1e-9:
            x = np.exp(u * math.log(rows + 1))
        else:
            x = ((math.pow(rows + 1, 1 - s) - 1) * u + 1) ** (1 / (1 - s))
        return np.minimum(np.floor(x).astype(np.int64) - 1, rows - 1)

    def _effect(self, t: int, ids: np.ndarray) -> np.ndarray:
        key = ids.astype(np.uint64) * np.uint64(1_000_003) + np.uint64(t * 7919 + self.config.seed * 104_729)
        return (2 * _hash_unit(key) - 1) * math.sqrt(3.0)  # hidden per-id effect, mean 0, variance 1

    def _chunk(self, c: int) -> ClickBatch:
        if self._last is not None and self._last[0] == c:  # consecutive batches mostly share a chunk
            return self._last[1]
        batch = self._draw_chunk(c)
        self._last = (c, batch)
        return batch

    def _draw_chunk(self, c: int) -> ClickBatch:
        cfg, n = self.config, CHUNK
        rng = np.random.default_rng([cfg.seed, c])
        dense = self._dense(rng, n)
        score = ((dense - self.dense_mean) / self.dense_std) @ self.dense_w  # (n,)
        lengths, values = [], []
        for t, rows in enumerate(self.sizes):
            lens = np.ones(n, np.int64) if cfg.multi_hot == 1 else 1 + rng.poisson(cfg.multi_hot - 1, n)
            ids = self._zipf(rng, rows, int(lens.sum()))
            # mean effect over each bag: bag b covers ids[starts[b] : starts[b] + lens[b]]
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
            score += np.add.reduceat(self._effect(t, ids), starts) / lens
            lengths.append(lens)
            values.append(ids)
        logit = self.bias + cfg.signal * score / math.sqrt(cfg.num_dense + len(self.sizes))
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        sparse = JaggedBatch(torch.from_numpy(np.stack(lengths)), torch.from_numpy(np.concatenate(values)))
        return ClickBatch(torch.from_numpy(dense), sparse, torch.from_numpy(labels))

    # ---------------------------------------------------------------- public
    def samples(self, start: int, count: int) -> ClickBatch:
        """Samples ``start .. start+count-1`` of the stream as one batch."""
        if start < 0 or count < 0:
            raise ConfigError(f"start and count must be >= 0, got {start}, {count}")
        first, last = start // CHUNK, (start + count - 1) // CHUNK
        chunks = [self._chunk(c) for c in range(first, last + 1)] if count else [self._chunk(first)]
        if len(chunks) == 1:
            whole = chunks[0]
        else:
            whole = ClickBatch(
                torch.cat([b.dense for b in chunks]),
                JaggedBatch.cat([b.sparse for b in chunks]),
                torch.cat([b.labels for b in chunks]),
            )
        lo = start - first * CHUNK
        return whole.split_batch([lo, count, whole.batch_size - lo - count])[1]

    def batches(self, batch_size: int, num_batches: int, start: int = 0) -> Iterator[ClickBatch]:
        """``num_batches`` consecutive batches beginning at sample ``start``."""
        if batch_size < 1 or num_batches < 0:
            raise ConfigError(f"batch_size must be >= 1 and num_batches >= 0, got {batch_size}, {num_batches}")
        for i in range(num_batches):
            yield self.samples(start + i * batch_size, batch_size)

    def write_parquet(self, out: Path | str, rows: dict[str, int], *, row_group_size: int = 65536,
                      overwrite: bool = False) -> dict:  # fmt: skip
        """Write the layout of ``criteo_loader`` (train, then val, then test rows of the stream); returns metadata."""
        unknown = set(rows) - set(SPLITS)
        if unknown or any(n < 0 for n in rows.values()):
            raise ConfigError(f"rows must map splits {SPLITS} to counts >= 0, got {rows}")
        check_output_parent(out)
        multi = self.config.multi_hot != 1
        with atomic_directory(out, overwrite=overwrite, ours=is_click_folder, what="click-log folder") as tmp:
            writer = ClickParquetWriter(tmp, table_sizes=self.sizes, num_dense=self.config.num_dense,
                                        row_group_size=row_group_size, multi_hot=multi)  # fmt: skip
            pos = 0
            for split in SPLITS:
                end = pos + rows.get(split, 0)
                for lo in range(pos, end, CHUNK):
                    b = self.samples(lo, min(CHUNK, end - lo))
                    sparse = b.sparse if multi else b.sparse.values.view(-1, b.batch_size).t().numpy()
                    writer.append(split, b.labels.numpy().astype(np.int8), b.dense.numpy(), sparse)
                pos = end
            options = {"generator": "synthetic clicks", **asdict(self.config)}
            options["table_sizes"] = list(self.sizes)
            meta = writer.close(options)
        return meta
