// tk/common/common.cuh: includes everything in tk/common/ in reading order:
// base_types.cuh (scalars, pairs, convert, constants) -> base_ops.cuh (elementwise ops) ->
// util.cuh (macros, group<N>, shuffles, shared_allocator) -> concepts.cuh (layouts, concepts).
#pragma once
#include "base_types.cuh"
#include "base_ops.cuh"
#include "util.cuh"
#include "concepts.cuh"
