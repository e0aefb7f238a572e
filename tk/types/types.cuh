// tk/types/types.cuh: includes every tile and vector type in reading order:
// rt_base.cuh (16x16 fragment) -> rv.cuh (register vectors) -> rt.cuh (register tiles) ->
// st.cuh (swizzled shared tiles) -> sv.cuh (shared vectors).
#pragma once
#include "rt_base.cuh"
#include "rv.cuh"
#include "rt.cuh"
#include "st.cuh"
#include "sv.cuh"
