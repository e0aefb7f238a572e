"""GPU tests of the Hopper attention forward (kernels/attention_hopper.cu) against float64.

Runs only on an sm_90 GPU. Uses the torch extension (kernels/attention_hopper.py), or, when
TK_ATTENTION_HOPPER_LIB names a prebuilt library, the same launcher through ctypes
(tests/attention_hopper_ctypes.py) — that saves the extension's build time on the GPU machine.
Every output is poisoned with NaN before the kernel runs, so an unwritten element fails.
"""
import functools
import math
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 (Hopper) GPU")

O_TOL = 1e-2      # relative norm error of O; bf16 inputs and P land around 2e-3..4e-3
LSE_ATOL, LSE_RTOL = 1e-3, 1e-4


def _poison_allocator(device):
    # The extension allocates o and lse with torch.empty; fill the caching allocator's free
    # blocks with NaN first so an element the kernel forgets to write shows up as NaN.
    junk = torch.full((64 << 20,), float("nan"), dtype=torch.float32, device=device)
    del junk


@functools.lru_cache(maxsize=None)
def _ctypes_harness():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_hopper_ctypes.py")
    spec = importlib.util.spec_from_file_location("attention_hopper_ctypes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hopper_forward(q, k, v, causal=True, scale=None, variant=0):
    if os.environ.get("TK_ATTENTION_HOPPER_LIB"):
        return _ctypes_harness().forward(q, k, v, causal, scale, variant)
    from kernels import attention_hopper
    reason = attention_hopper.why_not(q, k, v, causal, 0.0, scale)
    if reason is not None:
        raise ValueError(reason)
    _poison_allocator(q.device)
    return attention_hopper.forward(q, k, v, causal, scale, variant)


def reference(q, k, v, causal, scale):
    """float64 attention and its natural-log LSE."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        T = q.shape[2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def make_qkv(B, H, T, D, std=1.0, packed=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if packed:   # views of one (B, T, 3, H, D) tensor, as c_attn's output is split in model.py
        qkv = (torch.randn(B, T, 3, H, D, device="cuda", generator=g) * std).bfloat16()
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
    return tuple((torch.randn(B, H, T, D, device="cuda", generator=g) * std).bfloat16() for _ in range(3))


def check(q, k, v, causal=True, scale=None, variant=0):
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    o, lse = hopper_forward(q, k, v, causal, scale, variant)
    torch.cuda.synchronize()
    o_ref, lse_ref = reference(q, k, v, causal, scale)
    assert o.shape == q.shape and o.dtype == torch.bfloat16
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert not torch.isnan(o).any(), "O has NaN (unwritten or overflowed elements)"
    assert not torch.isnan(lse).any(), "LSE has NaN (unwritten or overflowed rows)"
    err = ((o.double() - o_ref).norm() / o_ref.norm()).item()
    assert err < O_TOL, f"relative error of O {err:.2e} >= {O_TOL}"
    lse_err = (lse.double() - lse_ref).abs()
    bound = LSE_ATOL + LSE_RTOL * lse_ref.abs()
    assert (lse_err <= bound).all(), f"LSE off by up to {lse_err.max().item():.2e}"
    return o, lse


SEQ_LENS = [1, 17, 64, 255, 256, 1000, 1024, 4096]
# Every kernel variant (see attention_hopper_forward_variant in the .cu); 0, the default, is one
# of them and runs in the tests below that do not name one.
# TK_ATTENTION_HOPPER_VARIANTS="1 2" narrows the list (the GPU check script drops a variant
# whose smoke run hung, so that one hang does not eat the whole run).
from kernels.attention_hopper import VARIANTS as KERNEL_VARIANTS   # the names only: nothing builds
_WANTED = os.environ.get("TK_ATTENTION_HOPPER_VARIANTS")
VARIANTS = [v for v in sorted(KERNEL_VARIANTS) if v] if _WANTED is None else [int(v) for v in _WANTED.split()]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T", SEQ_LENS)
def test_causal(T, D, variant):
    B, H = (1, 1) if T >= 4096 else (2, 3)
    check(*make_qkv(B, H, T, D, seed=T + D), variant=variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T", [1, 17, 255, 1000])
def test_full_attention(T, D, variant):
    check(*make_qkv(1, 2, T, D, seed=7 * T + D), causal=False, variant=variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T", [255, 1024])
def test_large_logits(T, D, variant):
    # std-4 inputs: logits spread over tens of units, softmax rows dominated by a few keys, where
    # a missing max subtraction overflows exp and a wrong rescale shows at once.
    q, k, v = make_qkv(1, 2, T, D, std=4.0, seed=11 * T + D)
    check(q, k, v, variant=variant)
    check(q, k, v, scale=1.0, variant=variant)     # explicit scale, 8-11x larger than 1/sqrt(D)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("D", [64, 128])
def test_row_max_jumps_in_a_late_tile(D, variant):
    # Mild logits, except that one late key (and, for the later rows, a second one further on) scores
    # far above everything before it, for every query: the running max of those rows jumps by tens
    # of log2 units in a late key tile. Variants that keep a stale max while it stays within 2^8
    # (STALE_MAX: 37, the default) must take their slow path there; the rows before the key never
    # see it.
    T = 1000
    q, k, v = make_qkv(2, 3, T, D, std=0.5, seed=5 * D)
    g = torch.Generator(device="cuda").manual_seed(D)
    e = torch.randn(D, device="cuda", generator=g)
    e /= e.norm()                                              # every query leans on e
    q = (q.float() + e).bfloat16()
    k = k.clone()
    for key, gain in ((700, 10.0 * D ** 0.5), (900, 25.0 * D ** 0.5)):   # scaled scores ~10, ~25 nats
        k[:, :, key] = (gain * e).bfloat16()
    check(q, k, v, variant=variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T", [17, 1000])
def test_packed_qkv_views(T, D, variant):
    q, k, v = make_qkv(2, 3, T, D, packed=True, seed=5 * T + D)
    assert not q.is_contiguous()       # the point: strided views, no copies
    check(q, k, v, variant=variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_many_query_blocks_per_sm(D, causal, variant):
    # 150 heads x 8 (or 16) query blocks: more work items than SMs, so a persistent CTA (variants
    # 8, 11-13, 21) walks over items of different lengths with its K/V ring and Q slots carried along,
    # and the L2 groups of heads (5, 8, 11-13, 21) end in a short group (65+65+20 heads at D=64, 4x32+22
    # at D=128).
    check(*make_qkv(3, 50, 1000, D, std=2.0, seed=D + causal), causal=causal, variant=variant)


def test_default_variant():
    check(*make_qkv(2, 3, 1000, 64, seed=4))
    check(*make_qkv(2, 3, 1000, 128, seed=5))


def test_two_streams_at_once():
    """Two default (dynamically scheduled) forwards in flight at once on two CUDA streams. Each
    call has its own work counter, so each computes every query block: the outputs equal those of
    the same calls one after the other, bit for bit (an item's arithmetic does not depend on which
    CTA draws it). With the one shared counter of session 4, each launch skipped the items the
    other drew: rows left as the allocator's NaN poison, or stale."""
    inputs = [make_qkv(8, 16, 2048, 64, seed=21), make_qkv(8, 16, 2048, 64, seed=22)]
    want = [hopper_forward(*x) for x in inputs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(3):
        _poison_allocator(inputs[0][0].device)
        got = []
        for x, stream in zip(inputs, streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                got.append(hopper_forward(*x))
        torch.cuda.synchronize()
        for (o, lse), (o_want, lse_want) in zip(got, want):
            assert torch.equal(lse, lse_want) and torch.equal(o, o_want)


@pytest.mark.skipif(bool(os.environ.get("TK_ATTENTION_HOPPER_LIB")),
                    reason="captures the torch extension's forward in a CUDA graph")
@pytest.mark.parametrize("variant", [0] + VARIANTS)
def test_in_a_cuda_graph_after_the_kernels_that_write_its_inputs(variant):
    """The forward captured in one CUDA graph behind the copies that write q, k, v (and, but for
    the default, its counter's zeroing), replayed with new inputs each time, as training with
    graphs runs it. The PDL variant (26) may start while the kernel before it finishes and must
    wait for it (griddepcontrol.wait) before reading anything; the default (37) runs on a counter
    of the graph's own that it sets back to 0 after each replay: each replay must give the float64
    answer for ITS inputs, not the previous replay's (the two input sets differ everywhere)."""
    from kernels import attention_hopper
    B, H, T, D = 2, 12, 1000, 64
    sets = [make_qkv(B, H, T, D, seed=41), make_qkv(B, H, T, D, seed=42)]
    staging = [torch.empty_like(t) for t in sets[0]]
    q, k, v = (torch.empty_like(t) for t in sets[0])

    def step():
        for dst, src in zip((q, k, v), staging):
            dst.copy_(src)
        return attention_hopper.forward(q, k, v, True, None, variant)

    for dst, src in zip(staging, sets[0]):
        dst.copy_(src)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the capture, as torch asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = step()
    for inputs in sets + sets:
        for dst, src in zip(staging, inputs):
            dst.copy_(src)
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        o_ref, lse_ref = reference(*inputs, True, 1 / math.sqrt(D))
        assert not torch.isnan(o).any() and not torch.isnan(lse).any()
        err = ((o.double() - o_ref).norm() / o_ref.norm()).item()
        assert err < O_TOL, f"relative error of O {err:.2e} >= {O_TOL} (stale inputs or counter?)"
        assert ((lse.double() - lse_ref).abs() <= LSE_ATOL + LSE_RTOL * lse_ref.abs()).all()


@pytest.mark.skipif(bool(os.environ.get("TK_ATTENTION_HOPPER_LIB")),
                    reason="the counters the bindings own are the torch extension's")
def test_default_counter_is_back_at_zero_for_the_next_call():
    """The default (37) reuses one counter per stream, which each launch sets back to 0 when it
    hands out its last item. Calls of different sizes back to back (no synchronisation between
    them; fewer and more work items than SMs, D 64 and 128): a counter left at any other value
    would make the next call skip items, whose rows stay NaN (poisoned) or wrong."""
    shapes = [(2, 3, 1000, 64), (1, 1, 17, 64), (3, 50, 1000, 64), (1, 2, 255, 128), (3, 50, 300, 128),
              (2, 3, 1000, 64)]
    inputs = [make_qkv(*shape, seed=60 + i) for i, shape in enumerate(shapes)]
    outputs = [hopper_forward(*x) for x in inputs]       # each poisons the free memory first
    torch.cuda.synchronize()
    for (q, k, v), (o, lse) in zip(inputs, outputs):
        o_ref, lse_ref = reference(q, k, v, True, 1 / math.sqrt(q.shape[-1]))
        assert not torch.isnan(o).any() and not torch.isnan(lse).any()
        assert ((o.double() - o_ref).norm() / o_ref.norm()).item() < O_TOL
        assert ((lse.double() - lse_ref).abs() <= LSE_ATOL + LSE_RTOL * lse_ref.abs()).all()


@pytest.mark.skipif(bool(os.environ.get("TK_ATTENTION_HOPPER_LIB")),
                    reason="captures the torch extension's forward in a CUDA graph")
def test_graph_replays_beside_eager_calls_on_another_stream():
    """A CUDA graph of the default forward replayed on one stream while eager default forwards run
    on another, at once: the graph's launch has a counter of its own, the eager stream another
    (with one shared counter each would take the other's items)."""
    from kernels import attention_hopper
    x_graph, x_eager = make_qkv(8, 16, 1024, 64, seed=71), make_qkv(8, 16, 1024, 64, seed=72)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention_hopper.forward(*x_graph)                # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, lse_graph = attention_hopper.forward(*x_graph)
    o_want, lse_want = attention_hopper.forward(*x_eager)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    o_graph_want, lse_graph_want = o_graph.clone(), lse_graph.clone()
    ref_graph = reference(*x_graph, True, 1 / 8)
    assert ((o_graph_want.double() - ref_graph[0]).norm() / ref_graph[0].norm()).item() < O_TOL
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(3):
        o_graph.fill_(float("nan"))
        torch.cuda.synchronize()
        with torch.cuda.stream(streams[0]):
            graph.replay()
        with torch.cuda.stream(streams[1]):
            got = [attention_hopper.forward(*x_eager) for _ in range(2)]
        torch.cuda.synchronize()
        assert torch.equal(o_graph, o_graph_want) and torch.equal(lse_graph, lse_graph_want)
        for o, lse in got:
            assert torch.equal(o, o_want) and torch.equal(lse, lse_want)


def test_batch_head_one_and_many():
    check(*make_qkv(1, 1, 300, 64, seed=1))
    check(*make_qkv(5, 7, 130, 64, seed=2))


def test_deterministic():
    q, k, v = make_qkv(2, 2, 777, 64, seed=9)
    o1, lse1 = hopper_forward(q, k, v)
    o2, lse2 = hopper_forward(q, k, v)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)


def test_unsupported_inputs_are_refused():
    q, k, v = make_qkv(1, 1, 16, 96)
    with pytest.raises(ValueError, match="head_dim"):
        hopper_forward(q, k, v)
    q, k, v = make_qkv(1, 1, 16, 64)
    q_odd = torch.empty(1, 1, 16, 68, dtype=q.dtype, device=q.device)[..., :64]   # stride 68
    q_odd.copy_(q)
    with pytest.raises(ValueError, match="stride"):
        hopper_forward(q_odd, k, v)


@pytest.mark.skipif(bool(os.environ.get("TK_ATTENTION_HOPPER_LIB")),
                    reason="checks the torch extension's bindings, not the ctypes library")
def test_removed_variants_are_refused():
    # variants that lost on the H200 were taken out (the .cu's opening comment): their numbers
    # must give the clear error, in Python and in the bindings, never a launch
    from kernels import attention_hopper
    q, k, v = make_qkv(1, 1, 64, 64)
    for variant in (1, 3, 6, 7, 9, 10, 14, 15, 19, 20, 22, 23, 24, 25, 27, 28, 29, 31, 32, 34, 35, 36, 38, -1):
        with pytest.raises(ValueError, match="variant must be one of"):
            attention_hopper.forward(q, k, v, True, None, variant)
        why = attention_hopper._ext.module.check_forward(q, k, v, True, 0.125, variant)
        assert why == (f"tk Hopper attention: variant must be 0 (the default) .. 37 and one of 0, 2, 4, 5, 8, "
                       f"11, 12, 13, 21, 26, 30, 33, 37 (the others were removed), got {variant}"), why


@pytest.mark.skipif(bool(os.environ.get("TK_ATTENTION_HOPPER_LIB")),
                    reason="runs through the torch extensions (kernels.attention_op), not the ctypes library")
@pytest.mark.parametrize("D", [64, 128])
def test_portable_backward_reads_hopper_lse(D):
    """The model's path on an H200: forward here, backward borrowed from the portable kernel,
    which recomputes P from our LSE. Gradients vs float64 autograd on the same bf16 inputs."""
    from kernels import attention_hopper  # noqa: F401  (registers the 'hopper' backend)
    from kernels import attention_op as A
    B, H, T = 2, 3, 300
    g = torch.Generator(device="cuda").manual_seed(D)
    qkv = (torch.randn(B, T, 3, H, D, device="cuda", generator=g) * 1.5).bfloat16().requires_grad_()
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    grad_out = torch.randn(B, H, T, D, device="cuda", generator=g).bfloat16()
    old = A.set_backend("hopper")
    try:
        assert A._choose(q, True, 1 / math.sqrt(D), "forward")[0] == "hopper"
        o = A.attention(q, k, v, causal=True)
        (dqkv,) = torch.autograd.grad(o, qkv, grad_out)
    finally:
        A.set_backend(old)
    ref = qkv.detach().double().requires_grad_()
    rq, rk, rv = ref.permute(2, 0, 3, 1, 4)
    s = (rq @ rk.transpose(-1, -2)) / math.sqrt(D)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    o_ref = torch.softmax(s, -1) @ rv
    (dqkv_ref,) = torch.autograd.grad(o_ref, ref, grad_out.double())
    assert ((o.double() - o_ref).norm() / o_ref.norm()).item() < O_TOL
    for i, name in enumerate("qkv"):
        got, want = dqkv[:, :, i].double(), dqkv_ref[:, :, i]
        assert torch.isfinite(got).all()
        err = ((got - want).norm() / want.norm()).item()
        assert err < 2e-2, f"d{name} relative error {err:.2e}"
