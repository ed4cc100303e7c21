// CUDA emulator (tests only): the part of cooperative_groups that kernels/cuda uses, the
// thread block cluster (sm_90). A cluster's blocks run one after another up to each
// cluster.sync(), every block of the cluster to the barrier before any goes on (emu.cc; in
// rank order in every other cluster, the reverse in the others), so what a block wrote
// (global memory) before the barrier is there for the others after it, and a read of another
// block's writes without the barrier finds what was there before in one of the orders.
#pragma once

#include "cuda_runtime.h"

namespace cooperative_groups {

class cluster_group {
 public:
  void sync() const { emu::ClusterSync(); }
  unsigned block_rank() const { return emu::ClusterBlockRank(); }
  unsigned num_blocks() const { return emu::ClusterNumBlocks(); }
};

inline cluster_group this_cluster() { return cluster_group(); }

}  // namespace cooperative_groups
