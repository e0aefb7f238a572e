"""Where does tk + torch.compile spend its compile time at GPT-2? (session 6: not done in 130 s)

    python tests/tk_compile_time.py STACKS_FILE [seconds between stack dumps, default 30]

Runs `bench.py --profile --kernels tk --profile-compile default` (GPT-2, 3 warm-up steps, one
profiled) with every thread's Python stack written to STACKS_FILE every N seconds, so a compile
that does not finish still says where it was. At the end prints dynamo's compile-time breakdown.
A GPU-machine diagnostic for the lead, not a test (pytest does not collect it)."""
import faulthandler
import os
import runpy
import sys
import time

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    every = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)     # runpy does not put the repository on the path
    os.chdir(root)
    stacks = open(sys.argv[1], "w")
    faulthandler.dump_traceback_later(every, repeat=True, file=stacks)
    sys.argv = ["bench.py", "--profile", "--models", "gpt2", "--kernels", "tk", "--profile-compile", "default",
                "--warmup", "3", "--profile-steps", "1", "--profile-rows", "25",
                "--json", os.path.join(os.path.dirname(os.path.abspath(stacks.name)), "tk_compile.json")]
    t = time.time()
    try:
        runpy.run_path("bench.py", run_name="__main__")
    except SystemExit as e:
        print(f"bench.py exited with {e.code}")
    except Exception:                        # say where it failed, then still print the timings
        import traceback
        traceback.print_exc()
    faulthandler.cancel_dump_traceback_later()
    print(f"tk + compile: finished in {time.time() - t:.0f} s (build, compile, 3 warm-up steps, 1 profiled)")
    from torch._dynamo.utils import compile_times
    print(compile_times(repr="str", aggregate=True))
