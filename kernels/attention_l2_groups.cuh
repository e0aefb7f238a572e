// kernels/attention_l2_groups.cuh: the order in which the Hopper attention kernels walk their work,
// shared by the forward (attention_hopper.cu, item_at: query blocks) and the backward
// (attention_hopper_bwd.cu, block_at: key blocks).
//
// Every block of one head reads the same per-head tensors (K and V in the forward; Q, dO, lse and
// the dQ accumulator in the backward), so the blocks of a head should run close together in time
// and find those tensors in L2 rather than in DRAM. Heads are taken in groups of heads_per_group,
// sized on the host so that a group's per-head tensors fill at most a third of the H200's 50 MB L2
// (the rest is for what streams past); inside a group, work goes block rank by block rank, every
// head of the group for one rank before the next. heads_per_group = batch·heads is the order the
// first kernels used (every head's first block, then every head's second, ...).
#pragma once
#include <algorithm>
#include <cstdint>

namespace attention_l2 {

// A group's per-head tensors take at most this much.
constexpr int64_t GROUP_BYTES = 16ll << 20;

// Host: heads per group for per-head tensors of bytes_per_head (all heads in one group without
// l2_groups: the first kernels' order).
inline int heads_per_group(bool l2_groups, int64_t bytes_per_head, int batch_heads) {
    if (!l2_groups) return batch_heads;
    return int(std::min<int64_t>(std::max<int64_t>(GROUP_BYTES / bytes_per_head, 1), batch_heads));
}

// Device: work item i -> (batch·head index, block rank within the head; rank 0 first).
struct slot { int bh, rank; };
__device__ inline slot slot_at(int i, int heads_per_group, int blocks, int batch_heads) {
    const int group_items = heads_per_group * blocks;
    const int group = i / group_items, in_group = i - group * group_items;
    const int first_bh = group * heads_per_group;
    const int heads_here = min(heads_per_group, batch_heads - first_bh);   // the last group may be short
    return slot{first_bh + in_group % heads_here, in_group / heads_here};
}

}  // namespace attention_l2
