"""The Triton body of ``haloflow::keyed_dropout`` (``keyed_dropout.py`` has the formulas), in a module of its own:
imported on the body's first call, so that ``import haloflow.kernels`` never loads Triton, and ``@triton.jit`` reads
``TRITON_INTERPRET`` then (the tests run it interpreted on CPU tensors)."""

import triton
import triton.language as tl


@triton.jit
def _mix(z):
    # splitmix64's finaliser on uint64 lanes (multiplication wraps mod 2^64, shifts are logical)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def keyed_dropout_fwd(h_ptr, ids_ptr, out_ptr, mask_ptr, scale_ptr, base, thr, n_elements, n_cols,
                      RELU: tl.constexpr, WRITE_MASK: tl.constexpr, BLOCK: tl.constexpr):
    # one program per BLOCK elements of the row-major (n, F) block; element (v, j) hashes (base, id_v, j // 2):
    # one read of h and the ids, one write of out and the mask. The scalars arrive as i32 or i64 by their value
    # (Triton's specialisation): widened to i64 first, then read as uint64 bits; the scale comes from a tensor of
    # h's dtype (a Python float would arrive as float32)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n_elements
    v = offs // n_cols
    j = offs % n_cols
    ids = tl.load(ids_ptr + v, mask=inside, other=0).to(tl.uint64, bitcast=True)
    key = _mix(ids ^ base.to(tl.int64).to(tl.uint64, bitcast=True))
    bits = _mix(key + (j // 2 + 1).to(tl.uint64) * 0x9E3779B97F4A7C15)
    draw = tl.where(j % 2 == 0, bits >> 32, bits & 0xFFFFFFFF)
    x = tl.load(h_ptr + offs, mask=inside, other=0.0)
    scale = tl.load(scale_ptr)
    keep = draw >= thr.to(tl.int64).to(tl.uint64, bitcast=True)
    if RELU:
        keep = keep & (x > 0)
    tl.store(out_ptr + offs, tl.where(keep, x * scale, x * 0), mask=inside)
    if WRITE_MASK:
        tl.store(mask_ptr + offs, keep.to(tl.uint8), mask=inside)
