"""Tests of the Hopper attention backward's persistent variants (kernels/attention_hopper_bwd.cu): 16
(PERSISTENT: one CTA per SM takes work items from a counter that prep_kernel zeroes, two K/V sets)
and 19 (16 + SPLIT_MASK: P's mask tests only in the blocks that need them; D = 64's default since
session 10). (17, LATE_DQ, 18, 15 + SPLIT_MASK, and session 10's 20-24, the dQ conversion inside
the main kernel, ran with these tests and were removed: they lost. The awkward-T and changing-shape
tests were written for 20-24 and passed with them in s10call2, and with 16 and 19 in session 10's
final check, tree 4a5a51a, where every test in this file passed.)

What can go wrong there and nowhere else, so what these shapes aim at: a CTA's second, third, ...
item (more items than SMs: 132 on the H200), the slots' phases carried from one item to the next
(items of different lengths, consumer 1's skipped first block at every item), the K/V set in use
when the producer has already loaded the next one, and the counter, zeroed again before every call
(repeated calls, CUDA-graph replays, shapes changing from call to call).

GPU (sm_90 only): dq, dk, dv against a float64 reference, outputs poisoned with NaN first; dK and
dV bit-identical to variant 15's (the kernel they change, D = 64's default in session 8: the same
arithmetic per item, one CTA's registers), dQ within bf16 rounding (fp32 sums in L2 in another order);
awkward T (odd, 1..1000) with B = 1 against float64.
CPU: the GPU script parses.

Also the sanitizer case: `python3 tests/test_attention_hopper_bwd_persistent.py [V ...]` runs
backward variants V (without V: 15, 16, 19) once each at shapes with more items than SMs, no
checks (compute-sanitizer racecheck / memcheck wrap it; tests/gpu_attention_bwd_persistent.sh).
"""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
gpu = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 (Hopper) GPU")
# TK_ATTENTION_HOPPER_BWD_VARIANTS="15 16" narrows these to the ones named (the GPU script leaves
# out a variant whose smoke run failed)
_WANTED = [int(v) for v in os.environ.get("TK_ATTENTION_HOPPER_BWD_VARIANTS", "16 19").split()]
PERSISTENT = tuple(v for v in (16, 19) if v in _WANTED)
BASE = 15   # the variant they change (D = 64's default in session 8)
needs_variants = pytest.mark.skipif(not PERSISTENT, reason="TK_ATTENTION_HOPPER_BWD_VARIANTS names neither 16 nor 19")


def sms():
    return torch.cuda.get_device_properties(0).multi_processor_count


def items(B, H, T):
    return B * H * ((T + 127) // 128)


# (B, H, T, causal): items = B·H·ceil(T/128); every one well above 132
SHAPES = [
    (8, 12, 1000, True),    # 768 items, T a tail of 104 keys in the last key block
    (16, 12, 300, True),    # 576 short items (3 key blocks, 5 query blocks), every slot reused across items
    (40, 7, 65, True),      # 280 one-block items: consumer 1's keys past T and right of the only query block
    (12, 12, 255, False),   # 288 items, non-causal: every item walks all 4 query blocks
    (3, 30, 1000, True),    # 720 items, 90 heads: the last L2 group short (26 of 32 heads)
    (40, 7, 17, True),      # 280 items of one partial query block (17 rows), every key of consumer 1 past T
    (150, 1, 1, True),      # 150 items of one key: P = 1, dS = 0, so dq is 0 (floored as in check)
]


@gpu
@needs_variants
@pytest.mark.parametrize("B,H,T,causal", SHAPES)
def test_persistent_against_float64(B, H, T, causal):
    # test_attention_hopper_bwd.check's comparison, the float64 reference computed once for both
    import test_attention_hopper_bwd as base
    assert items(B, H, T) > sms(), "the shape must give each CTA more than one item"
    scale = 1.0 / math.sqrt(64)
    _, q, k, v, d_o = base.make_inputs(B, H, T, 64, seed=B * 1000 + T)
    o_ref, lse_ref, grads_ref = base.reference(q, k, v, d_o, causal, scale)
    o = o_ref.bfloat16().transpose(1, 2).contiguous().transpose(1, 2)
    lse = lse_ref.float().contiguous()
    for variant in PERSISTENT:
        out = tuple(torch.empty(B, T, H, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        base.poison(*out)
        base.run_backward(d_o, q, k, v, o, lse, causal, scale, out, variant)
        torch.cuda.synchronize()
        for name, x, ref in zip(("dq", "dk", "dv"), out, grads_ref):
            assert not torch.isnan(x).any(), f"variant {variant} {name} has NaN (unwritten elements)"
            err = base.rel_err(x, ref, floor=1e-2 * grads_ref[2].norm().item())   # check's floor (T = 1)
            assert err < base.GRAD_TOL, f"variant {variant} {name}: relative error {err:.2e} (B={B} H={H} T={T})"


def run(variant, x, out=None):
    from kernels import attention_hopper
    ext = attention_hopper._bwd_ext.module
    if out is None:
        out = tuple(torch.full_like(x["q"], float("nan")) for _ in range(3))
    ext.backward_into(x["d_o"], x["q"], x["k"], x["v"], x["o"], x["lse"], x["causal"], x["scale"], *out, variant)
    return out


def inputs(B, H, T, causal, seed):
    import test_attention_hopper_bwd as base
    from kernels import attention_hopper
    _, q, k, v, d_o = base.make_inputs(B, H, T, 64, packed=True, seed=seed)
    scale = 1.0 / math.sqrt(64)
    o, lse = attention_hopper.forward(q, k, v, causal, scale)
    return dict(q=q, k=k, v=v, d_o=d_o, o=o, lse=lse, causal=causal, scale=scale)


@gpu
@needs_variants
@pytest.mark.parametrize("B,H,T,causal", SHAPES[:4])
def test_persistent_variants_equal_15(B, H, T, causal):
    import test_attention_hopper_bwd as base
    x = inputs(B, H, T, causal, seed=T + B)
    ref = run(BASE, x)
    for variant in PERSISTENT:
        for _ in range(3):   # repeated calls: the counter is zeroed again each time
            got = run(variant, x)
            torch.cuda.synchronize()
            assert torch.equal(got[1], ref[1]), f"variant {variant}: dk differs from 15's"
            assert torch.equal(got[2], ref[2]), f"variant {variant}: dv differs from 15's"
            assert not torch.isnan(got[0]).any()
            err = base.rel_err(got[0], ref[0].double())
            assert err < 1e-2, f"variant {variant} dq: {err:.2e} from 15's"


@gpu
@pytest.mark.parametrize("variant", PERSISTENT)
def test_persistent_in_a_cuda_graph(variant):
    # prep_kernel's zeroing of the counters is part of the captured work: every replay starts at 0
    x = inputs(8, 12, 1000, True, seed=77)
    ref = run(BASE, x)
    out = tuple(torch.full_like(x["q"], float("nan")) for _ in range(3))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(variant, x, out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(variant, x, out)
    for _ in range(3):
        for t in out:
            t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[1], ref[1]) and torch.equal(out[2], ref[2])
        assert not torch.isnan(out[0]).any()
        import test_attention_hopper_bwd as base
        assert base.rel_err(out[0], ref[0].double()) < 1e-2, f"variant {variant}: replayed dq far from 15's"


# T: odd and awkward (one key, a partial first query block, one past a key block, a tail of one
# row in the last query block, ...), B = 1: fewer items than SMs (each CTA's first fetch ends it)
AWKWARD_T = [1, 3, 63, 65, 127, 129, 191, 333, 641, 999]


@gpu
@needs_variants
@pytest.mark.parametrize("causal", [True, False])
def test_awkward_T_against_float64(causal):
    import test_attention_hopper_bwd as base
    for T in AWKWARD_T:
        for variant in PERSISTENT:
            base.check(1, 3, T, 64, causal=causal, seed=T + 3 * causal, variant=variant)


@gpu
@needs_variants
def test_shapes_change_between_calls():
    # the scratch (accumulator + work counter) is a fresh allocation each call, smaller or larger
    # than the last one's, reusing freed memory that held other sums and counts: every call must
    # start from prep_kernel's zeros
    import test_attention_hopper_bwd as base
    for variant in PERSISTENT:
        for B, H, T in ((4, 12, 1000), (1, 1, 77), (8, 12, 1000), (2, 5, 129), (8, 12, 1000), (3, 7, 333),
                        (1, 2, 4096)):
            x = inputs(B, H, T, True, seed=B + T)
            ref = run(BASE, x)
            for _ in range(2):
                got = run(variant, x)
                torch.cuda.synchronize()
                assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2]), (variant, B, H, T)
                assert not torch.isnan(got[0]).any(), f"variant {variant}: dq has unwritten rows (B={B} H={H} T={T})"
                err = base.rel_err(got[0], ref[0].double())
                assert err < 1e-2, f"variant {variant} dq: {err:.2e} from 15's (B={B} H={H} T={T})"


def test_gpu_script_parses():
    script = ROOT / "tests" / "gpu_attention_bwd_persistent.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "test_attention_hopper_bwd_persistent.py" in text and "compute-sanitizer" in text
    assert "kernels.attention_bwd_bench" in text


def sanitize_case(variants):
    """One call of each variant at shapes with more items than SMs (small T, so the sanitizers
    finish), and one with fewer (every CTA's first fetch is the stop)."""
    from kernels import attention_hopper as A
    ext = A._bwd_ext.module
    for B, H, T in ((6, 12, 130), (2, 3, 300), (24, 7, 65)):
        torch.manual_seed(T)
        qkv = torch.randn(B, T, 3, H, 64, device="cuda").bfloat16()
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        o, lse = A.forward(q, k, v, True, 0.125)
        d_o = torch.randn(B, T, H, 64, device="cuda").bfloat16().transpose(1, 2)
        for variant in variants:
            dqkv = torch.empty_like(qkv)
            ext.backward_into(d_o, q, k, v, o, lse, True, 0.125, *dqkv.permute(2, 0, 3, 1, 4).unbind(0), variant)
            torch.cuda.synchronize()
            print(f"  B={B} H={H} T={T} ({items(B, H, T)} items) variant {variant} ran", flush=True)
    print("sanitize case ran: variants", variants)


if __name__ == "__main__":
    sanitize_case([int(v) for v in sys.argv[1:]] or [BASE, 16, 19])
