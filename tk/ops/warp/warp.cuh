// tk/ops/warp/warp.cuh: includes the warp-scope ops in reading order:
// memory_shared (st <-> rt, ldmatrix/stmatrix) -> memory_global (global <-> rt/st/rv/sv) ->
// memory_async (cp.async) -> maps -> reductions (row_/col_, _row/_col) -> conversions -> masks
// -> mma (mma_AB, mma_ABt, mma_AtB, mma_AtBt).
#pragma once
#include "memory_shared.cuh"
#include "memory_global.cuh"
#include "memory_async.cuh"
#include "maps.cuh"
#include "reductions.cuh"
#include "conversions.cuh"
#include "masks.cuh"
#include "mma.cuh"
