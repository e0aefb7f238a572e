#!/bin/bash
# One H200 call for the fused LM head + cross-entropy (kernels/lm_head_op.py, cross_entropy.cu):
# build, a smoke check at GPT-2's training shape, the GPU tests, the bench row, compute-sanitizer.
# Usage: bash tests/gpu_lm_head.sh OUTDIR   (OUTDIR/summary.txt, logs in OUTDIR/logs; expected ~5 min
# on a cold machine: build ~30 s, smoke ~15 s, pytest ~50 s, bench ~30 s, sanitizer ~60 s; each
# step has a timeout, all of them together LANE_LIMIT (default 480 s): tests/gpu_lib.sh's step).
# Env: SKIP_PYTEST=1, SKIP_BENCH=1, SKIP_SANITIZE=1, BENCH_ARGS (default: --quick, default compile mode).
# FINAL=1 (the session's last call, <= 90 s, extension already built): only what changed since
# call 2 (rows_in_shared, rows_per_warp, requested kernels, the CUDA-graph test): the kernel
# timings and those GPU tests; no GPT-2 op smoke, bench or sanitizer. Expected ~70 s.
cd "$(dirname "$0")/.."
source tests/gpu_lib.sh "${1:-/tmp/lm_head_out}"   # OUT, L (logs), S (summary), note, step
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$S"

step 180 build.log python3 -c "from kernels import lm_head_op; r = lm_head_op._ext.why_not(); print('build:', r); assert r is None"
note "build rc=$? ($(grep -E '^build:' "$L/build.log" | tail -1))"

if [ -n "$FINAL" ]; then SKIP_BENCH=1 SKIP_SANITIZE=1; fi

if [ -z "$FINAL" ]; then
step 120 smoke.log python3 - <<'PY'
# GPT-2's training shape: tk vs the reference (both under bf16 autocast) and the kernel's plan.
import torch
from kernels import lm_head_op, reference
def rel(a, b): return ((a.double() - b.double()).norm() / b.double().norm()).item()
N, C, V = 32 * 1024, 768, 50304
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(N, C, device="cuda", generator=g).bfloat16().requires_grad_()
w = (torch.randn(V, C, device="cuda", generator=g) * 0.5 / C ** 0.5).requires_grad_()
t = torch.randint(0, V, (N,), device="cuda", generator=g); t[::97] = -1
print("plan:", lm_head_op._ext.module.plan(torch.empty(4096, V, device="cuda", dtype=torch.bfloat16)),
      "chunk rows:", lm_head_op.chunk_rows(N, V, 2))
out = {}
for name, fn in (("torch", reference.lm_head_loss), ("tk", lm_head_op.lm_head_loss)):
    torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fn(x, w, t)
    dx, dw = torch.autograd.grad(loss, (x, w))
    torch.cuda.synchronize()
    out[name] = (loss, dx, dw)
    print(f"{name}: loss {loss.item():.6f}, peak extra memory {(torch.cuda.max_memory_allocated() - base) / 2**30:.2f} GiB")
print("tk vs torch rel diff: loss %.2e dx %.2e dW %.2e" % tuple(rel(a, b) for a, b in zip(out["tk"], out["torch"])))
print("fp32-output GEMMs through out_dtype (True: used; False: refused by this torch, fallback):", lm_head_op._fp32_gemm_ok)
for name in out:   # 20 timed fwd+bwd, eager launch (the bench row has the graph-replay figures)
    fn = lm_head_op.lm_head_loss if name == "tk" else reference.lm_head_loss
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(25):
        if i == 5: s.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(x, w, t)
        torch.autograd.grad(loss, (x, w))
    e.record(); torch.cuda.synchronize()
    print(f"{name}: {s.elapsed_time(e) / 20:.2f} ms per fwd+bwd")
PY
note "smoke rc=$?"
fi

step 40 smoke.log python3 - <<'PY'
# the kernel alone on one GPT-2 chunk (4096 x 50304 bf16, 412 MB) and shakespeare's logits: each
# kernel that can take the rows, achieved bandwidth (median of 10 after 3 warm-up calls)
import torch
from kernels import lm_head_op
ext = lm_head_op._ext.module
for V, dt in ((50304, torch.bfloat16), (65, torch.bfloat16), (50304, torch.float32)):
    rows = 4096 if V > 65 else 16384   # a GPT-2 chunk; shakespeare-char's 64 x 256 tokens
    logits = (torch.randn(rows, V, device="cuda") * 2).to(dt)
    tc = torch.randint(0, V, (rows,), device="cuda"); lr = torch.empty(rows, device="cuda"); gs = torch.ones(1, device="cuda") / rows
    base, timed = logits.clone(), set()
    for kernel in ("registers", "shared", "streamed", "warp"):
        if ext.plan(logits, kernel) in timed:   # fell back to one already timed
            continue
        timed.add(ext.plan(logits, kernel))
        for write in (True, False):
            ms = []
            for i in range(13):
                logits.copy_(base)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(); ext.cross_entropy_(logits, tc, lr, gs, write, kernel); e.record()
                torch.cuda.synchronize(); ms.append(s.elapsed_time(e))
            ms = sorted(ms[3:])[5]
            moved = logits.numel() * logits.element_size() * (2 if write else 1)
            print(f"kernel {ext.plan(logits, kernel)} {rows}x{V} {str(dt)[6:]} write_grad={write}: "
                  f"{ms:.3f} ms, {moved / ms / 1e9:.2f} TB/s")
PY
note "kernel timings rc=$?"; grep -v "^\s*$" "$L/smoke.log" | tail -24

if [ -z "$SKIP_PYTEST" ]; then
  SELECT=""
  [ -n "$FINAL" ] && SELECT="kernel_loss_and_gradient or kernel_plans or loss_only or cuda_graph or requested_kernels or model_loss_and_grads or bad_arguments"
  step ${PYTEST_TIMEOUT:-$([ -n "$FINAL" ] && echo 65 || echo 200)} pytest.log python3 -m pytest -v --maxfail=10 --tb=short \
    tests/test_lm_head.py ${SELECT:+-k "$SELECT"}
  note "pytest rc=$? ($(grep -E '^=+ .* in [0-9.]+s' "$L/pytest.log" | tail -1))"
  grep -E "FAILED|ERROR|Fatal|passed|failed" "$L/pytest.log" | head -30
fi

if [ -z "$SKIP_BENCH" ]; then
  step ${BENCH_TIMEOUT:-150} bench.log python3 bench.py --ops lm_head ${BENCH_ARGS:---quick --compile-modes default --reps 20 --warmup 5} \
    --json "$OUT/bench_lm_head.json"
  note "bench rc=$?"; grep -v "^\s*$" "$L/bench.log" | tail -14
fi

if [ -z "$SKIP_SANITIZE" ]; then
  SAN='import torch
from kernels import lm_head_op
ext = lm_head_op._ext.module
for dt in (torch.bfloat16, torch.float32):
    for N, V in ((33, 1003), (9, 4104), (5, 65), (3, 70000), (7, 1000)):
        logits = torch.randn(N, V, device="cuda").to(dt)
        t = torch.randint(0, V, (N,), device="cuda"); t[::4] = -1
        rows = torch.empty(N, device="cuda")
        for kernel in ("registers", "shared", "streamed", "warp"):
            print(dt, N, V, kernel, "->", ext.plan(logits, kernel))
            ext.cross_entropy_(logits, t, rows, torch.ones(1, device="cuda"), True, kernel)
            ext.cross_entropy_(logits, t, rows, torch.ones(1, device="cuda"), False, kernel)
x = torch.randn(70, 64, device="cuda").requires_grad_(); w = torch.randn(1000, 64, device="cuda").requires_grad_()
t = torch.randint(0, 1000, (70,), device="cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    torch.autograd.grad(lm_head_op.lm_head_loss(x, w, t), (x, w))
torch.cuda.synchronize(); print("sanitizer script done")'
  step 90 memcheck.log compute-sanitizer --tool memcheck --print-limit 5 python3 -c "$SAN"
  note "memcheck rc=$? ($(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | tail -1))"
  step 90 racecheck.log compute-sanitizer --tool racecheck --print-limit 5 python3 -c "$SAN"
  note "racecheck rc=$? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log" | tail -1))"
fi
note "done"
