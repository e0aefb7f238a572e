// kernels/bindings_checks.h — how the bindings .cpp files (layernorm, mlp, gemm,
// attention_hopper) refuse a bad input. Read it before any of them.
//
// The pattern: a check returns a Problem, empty when the input is fine, otherwise the whole
// message (op, argument, what is wrong, what to do) already built as ONE std::string from
// std::string, std::to_string, Device::str() and c10::toString(ScalarType) only; raise_if()
// then throws it with one TORCH_CHECK_TYPE / TORCH_CHECK_VALUE whose message is that one
// string. No c10 object (Device, ScalarType, IntArrayRef) is ever streamed by `<<` or handed to
// TORCH_CHECK's variadic message builder.
//
// Why so plain: on the H200 (torch 2.11) a failing TORCH_CHECK whose message streamed c10
// objects killed the process with SIGSEGV instead of raising, in the layernorm and MLP bindings
// (kernels/NOTES.md, "End to end and the final check"); the attention bindings, which raise one
// pre-built string, passed the same kind of test on the same machine. The cause was not pinned
// down: this copies the pattern that worked. Each extension also exposes its checks as
// check_* functions returning the message ("" = fine), so a test or a caller can get the
// message without any C++ throw. Python callers check first anyway (kernels/checks.py).
#pragma once

#include <torch/extension.h>

#include <cstdio>
#include <string>
#include <utility>

namespace tk_bindings {

// A bad input: the message, and which Python exception fits it.
struct Problem {
    enum Kind { none, bad_value, bad_type } kind = none;   // bad_type: a dtype (Python TypeError)
    std::string message;
    explicit operator bool() const { return kind != none; }
};

inline Problem value_problem(std::string message) { return Problem{Problem::bad_value, std::move(message)}; }
inline Problem type_problem(std::string message) { return Problem{Problem::bad_type, std::move(message)}; }

// Throws c10::TypeError / c10::ValueError (Python TypeError / ValueError) if p is a problem.
inline void raise_if(const Problem& p) {
    TORCH_CHECK_TYPE(p.kind != Problem::bad_type, p.message);
    TORCH_CHECK_VALUE(p.kind != Problem::bad_value, p.message);
}

// A kernel launch (or a launcher's own refusal) failed: RuntimeError "<op>: <what> failed: <error>".
inline void raise_if_failed(const char* error, const char* op, const char* what) {
    if (error == nullptr) return;
    TORCH_CHECK(false, std::string(op) + ": " + what + " failed: " + error);
}

// "(16, 768)", "(768,)", "()": sizes or strides as Python prints a tuple; -1 prints as "any".
inline std::string dims(at::IntArrayRef a) {
    std::string s = "(";
    for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + (a[i] < 0 ? std::string("any") : std::to_string(a[i]));
    return s + (a.size() == 1 ? ",)" : ")");
}

inline std::string dtype_name(const at::Tensor& t) { return c10::toString(t.scalar_type()); }   // "BFloat16"
inline std::string device_name(const at::Tensor& t) { return t.device().str(); }              // "cuda:0"

// 1e-05, -1, nan, inf (std::to_string would print -1.000000 and 0.000010).
inline std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

inline bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace tk_bindings
