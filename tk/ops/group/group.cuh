// tk/ops/group/group.cuh — the warpgroup-scope half of tk (Hopper, sm_90a): includes, in reading
// order, sync.cuh (mbarriers, fences, named barriers, setmaxnreg) -> ../../types/global.cuh (gl
// and its TMA descriptors) -> tma.cuh (tile loads/stores on mbarriers) -> wgmma.cuh (descriptors,
// fence/commit/wait, the mma itself). A reader new to these should start at kernels/gemm_3_wgmma_tma.cu,
// which uses each piece once, then kernels/gemm_4_warp_specialized.cu (producer/consumer).
#pragma once
#include "sync.cuh"
#include "../../types/global.cuh"
#include "tma.cuh"
#include "wgmma.cuh"
