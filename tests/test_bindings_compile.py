"""CI (no GPU): the bindings .cpp files compile against this torch's headers, and the four that
follow kernels/bindings_checks.h keep its rule: no TORCH_CHECK of their own (they raise only
through tk_bindings::raise_if / raise_if_failed, one pre-built std::string each) and nothing
streamed. Why the rule: kernels/bindings_checks.h and kernels/NOTES.md (a failing TORCH_CHECK
that streamed c10 objects killed the process on the H200 instead of raising).

The compile is g++ -fsyntax-only -Wall -Wextra with the flags torch.utils.cpp_extension gives a
bindings file (its include paths, TORCH_EXTENSION_NAME, TORCH_API_INCLUDE_EXTENSION_H, the C++
ABI flag) plus the CUDA include directory. To parse torch's headers once instead of five times
(~15 s of CPU each), the files are compiled as ONE translation unit: torch's and our headers
first, then each bindings file inside a namespace of its own with its own TORCH_EXTENSION_NAME.
That catches type and syntax errors, not a missing #include in one file. torch's CPU wheel lacks
one generated CUDA header (c10/cuda/impl/cuda_cmake_macros.h); a one-line stand-in is supplied
when it is missing. The real build (kernels/build.py, on a GPU machine) compiles, links and runs
these files. Skips without g++ or the CUDA headers."""
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
RULED = ["layernorm_bindings.cpp", "mlp_bindings.cpp", "gemm_bindings.cpp", "attention_hopper_bindings.cpp"]
ALL = RULED + ["attention_bindings.cpp"]
HEADERS = ["torch/extension.h", "c10/cuda/CUDAGuard.h", "c10/cuda/CUDAStream.h", "cuda_runtime.h",
           "bindings_checks.h", "layernorm.h", "mlp.h", "gemm.cuh", "attention_params.h"]

GXX = shutil.which("g++")


def cuda_include():
    from torch.utils.cpp_extension import CUDA_HOME
    for home in (os.environ.get("CUDA_HOME"), CUDA_HOME, "/usr/local/cuda"):
        if home and (Path(home) / "include" / "cuda_runtime.h").exists():
            return Path(home) / "include"
    return None


def compile_command(tmp_path, source):
    from torch.utils.cpp_extension import include_paths
    flags = ["-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-DTORCH_API_INCLUDE_EXTENSION_H",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    system = list(include_paths()) + [str(cuda_include()), sysconfig.get_paths()["include"]]
    if not any((Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in system):
        stub = tmp_path / "stub" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        stub.parent.mkdir(parents=True)
        stub.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        system.append(str(tmp_path / "stub"))
    # torch's and CUDA's headers as system headers: -Wall -Wextra report on our code only.
    return [GXX, *flags, *[f for p in system for f in ("-isystem", p)], "-I", str(KERNELS), "-I", str(ROOT), str(source)]


def one_unit(names):
    lines = [f'#include "{h}"' if not h.startswith(("torch/", "c10/", "cuda_")) else f"#include <{h}>" for h in HEADERS]
    for i, name in enumerate(names):
        lines += ["#undef TORCH_EXTENSION_NAME", f"#define TORCH_EXTENSION_NAME bindings_check_{i}",
                  f"namespace bindings_file_{i} {{", f'#include "{name}"', "}"]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(GXX is None or cuda_include() is None, reason="needs g++ and the CUDA headers")
def test_bindings_compile(tmp_path):
    unit = tmp_path / "all_bindings.cpp"
    unit.write_text(one_unit(ALL))
    r = subprocess.run(compile_command(tmp_path, unit), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    ours = [line for line in r.stderr.splitlines()
            if "warning:" in line and any(n in line for n in RULED + ["bindings_checks.h"])]
    assert not ours, "\n".join(ours)


def code_of(path):
    """The file without // and /* */ comments and string literals (so a message may say anything)."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", " ", text)


@pytest.mark.parametrize("name", RULED)
def test_bindings_raise_only_prebuilt_strings(name):
    code = code_of(KERNELS / name)
    assert '#include "bindings_checks.h"' in (KERNELS / name).read_text()
    for banned in ("TORCH_CHECK", "TORCH_INTERNAL_ASSERT", "AT_ERROR", "AT_ASSERT", "c10::str(", "ostream",
                   "stringstream", "std::cout", "std::cerr"):
        assert banned not in code, f"{name} uses {banned}: raise through tk_bindings::raise_if (bindings_checks.h)"
    # Shifts are fine (1 << 31); a stream insertion would have a string or a name on its right.
    assert not re.search(r"<<\s*(\"|[A-Za-z_])", code.replace("<<<", "")), f"{name} streams something"


def test_the_header_raises_one_string_per_check():
    code = code_of(KERNELS / "bindings_checks.h")
    calls = re.findall(r"\b(TORCH_CHECK\w*)\s*\(", code)
    assert sorted(calls) == ["TORCH_CHECK", "TORCH_CHECK_TYPE", "TORCH_CHECK_VALUE"], calls
    for m in re.finditer(r"\bTORCH_CHECK\w*\s*\(", code):
        depth, args, i = 1, 1, m.end()
        while depth:                                  # count the top-level commas of the call
            ch = code[i]
            depth += ch in "([{" and 1 or 0
            depth -= ch in ")]}" and 1 or 0
            args += ch == "," and depth == 1
            i += 1
        assert args == 2, f"{code[m.start():i]}: a condition and ONE message expression"


def test_gpu_script_parses():
    script = ROOT / "tests" / "gpu_bindings_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "TORCH_EXTENSIONS_DIR" in text and "bindings.log" in text and "python3 -m pytest" in text
    for test_file in re.findall(r"tests/test_\w+\.py", text):
        assert (ROOT / test_file).exists(), test_file
