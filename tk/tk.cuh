// tk/tk.cuh: the one header a kernel includes. tk is a small tile library for NVIDIA tensor
// cores (sm_80 warp-level mma; sm_90a warpgroup wgmma/TMA). Start with tk/README.md, then read:
//   tk/common/  base types and pairs, elementwise ops, group<N> scopes, concepts
//   tk/types/   rt_base (16x16 fragment) -> rv -> rt (register tiles) -> st (swizzled shared) -> sv
//   tk/ops/warp/  loads/stores, maps, reductions, conversions, masks, mma
// Compile with -std=c++20; Hopper-only parts are guarded by TK_HOPPER (see tk/common/util.cuh).
#pragma once
#include "common/common.cuh"
#include "types/types.cuh"
#include "ops/warp/warp.cuh"
#include "ops/group/group.cuh"
#include "ops/group/tma_4d.cuh"
