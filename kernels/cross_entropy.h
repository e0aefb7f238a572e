// kernels/cross_entropy.h: the plain C++ face of kernels/cross_entropy.cu (no torch types here,
// so nvcc never parses torch headers). Called by kernels/lm_head_bindings.cpp after its checks;
// kernels/lm_head_op.py is the Python half that loops over row chunks around it.
#pragma once
#include <cstdint>
#include <cstring>
#include <cuda_runtime.h>

namespace tk_cross_entropy {

enum class DType { f32, bf16 };

// Which kernel runs a row (cross_entropy.cu explains each). automatic: rows_in_registers where
// the row is 16-byte aligned and fits (<= 65536 bf16 / 32768 float), else rows_streamed. Any
// other value asks for that kernel; where it cannot take the rows (alignment, width), the
// automatic choice runs instead. plan_name says which one a call takes.
enum class Kernel { automatic, registers, shared, streamed, warp };

// The names a caller (kernels/lm_head_op.py, through the bindings) asks for a kernel by, in one
// place so that the bindings' check, its error message and a CPU test agree. Returns false for an
// unknown name (kernel left as it was).
inline constexpr const char* KERNEL_NAMES = "'auto', 'registers', 'shared', 'streamed' or 'warp'";
inline bool kernel_from_name(const char* name, Kernel* kernel) {
    struct Entry { const char* name; Kernel kernel; };
    constexpr Entry table[] = {{"auto", Kernel::automatic}, {"registers", Kernel::registers}, {"shared", Kernel::shared},
                               {"streamed", Kernel::streamed}, {"warp", Kernel::warp}};
    for (const Entry& e : table)
        if (std::strcmp(e.name, name) == 0) { *kernel = e.kernel; return true; }
    return false;
}

// One call handles `rows` rows of a logits matrix, each `cols` wide, in place.
struct Args {
    void* logits;              // [rows][ld], dtype; read, then (write_grad) overwritten with dlogits
    int64_t rows;
    int64_t cols;              // the vocabulary size V: any value >= 1
    int64_t ld;                // elements from one row to the next (>= cols)
    DType dtype;
    const int64_t* targets;    // [rows]: a class in [0, cols), or -1 = ignore this row
    float* loss_rows;          // [rows] out: lse - logit[target]; 0 for an ignored row, NaN for a
                               //             target outside [0, cols) that is not -1
    const float* grad_scale;   // device scalar: 1 / (number of rows not ignored, over ALL chunks)
    bool write_grad;           // false: loss only, logits left as they are
    Kernel kernel;             // automatic unless a test or bench forces one
};

// Launches on `stream`; returns nullptr on success, else a message (nothing throws).
const char* cross_entropy_rows(const Args& a, cudaStream_t stream);

// Which kernel a call with these arguments takes, for tests and notes: "registers(VECS=n)",
// "shared", "streamed" or "warp".
const char* plan_name(const Args& a);

}  // namespace tk_cross_entropy
