// The CUDA emulator's own behaviour: barriers order shared memory, a missing barrier shows
// (whichever of its two threads would run first: blocks alternate between orders), warp
// exchanges, fresh NaN shared memory per block, launch-configuration errors, graph capture,
// cp.async copies that land only at their wait, a deadlock is reported rather than hung on,
// warp-wide matrix instructions that need every lane at once and aligned ldmatrix rows, and
// thread block clusters: what a block writes before cluster.sync() is there for the others
// after it, and not before.
#include <cmath>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
// The emulator's device header (tests/gpu/emu), as kernels/cuda sees it in this build.
#include "cooperative_groups.h"
#include "cuda_pipeline.h"
#include "cuda_runtime.h"

namespace {

// Each thread writes its slot, then reads its neighbour's.
void NeighbourKernel(float* out, bool sync) {
  float* s = static_cast<float*>(emu::DynamicShared());
  const int i = int(threadIdx.x), n = int(blockDim.x);
  s[i] = float(blockIdx.x * 1000 + i);
  if (sync) __syncthreads();
  out[blockIdx.x * n + i] = s[(i + 1) % n];
}

TEST(CudaEmulatorTest, BarrierOrdersSharedMemoryAndMissingOneShows) {
  constexpr int kBlocks = 3, kThreads = 96;
  std::vector<float> out(kBlocks * kThreads);
  emu::Launch(kBlocks, kThreads, kThreads * sizeof(float))(NeighbourKernel, out.data(), true);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < kBlocks; ++b) {
    for (int i = 0; i < kThreads; ++i) EXPECT_EQ(out[b * kThreads + i], float(b * 1000 + (i + 1) % kThreads));
  }
  // Without the barrier the early threads read slots nobody has written yet in this block:
  // shared memory starts as NaN bytes in every block, so they read NaN.
  emu::Launch(kBlocks, kThreads, kThreads * sizeof(float))(NeighbourKernel, out.data(), false);
  int nan = 0;
  for (float v : out) nan += std::isnan(v);
  EXPECT_GT(nan, 0);
}

// After an optional barrier (0: none, 1: __syncthreads, 2: __syncwarp), each thread writes
// its slot, then, without a barrier, reads the slot of the thread `offset` places before it in
// index order (threads with no such thread write -1).
void EarlierNeighbourKernel(float* out, int offset, int barrier_first) {
  float* s = static_cast<float*>(emu::DynamicShared());
  const int i = int(threadIdx.x), n = int(blockDim.x);
  if (barrier_first == 1) __syncthreads();
  if (barrier_first == 2) __syncwarp();
  s[i] = float(i);
  const int src = i - offset;
  out[blockIdx.x * n + i] = src >= 0 && src < n ? s[src] : -1.0f;
}

int CountNan(const std::vector<float>& v, size_t begin, size_t end) {
  int nan = 0;
  for (size_t i = begin; i < end; ++i) nan += std::isnan(v[i]);
  return nan;
}

// A missing barrier shows whichever thread of the pair runs first on the GPU: in index order
// a thread reading a later thread's slot reads NaN; in reverse order one reading an earlier
// thread's slot does (across warps, offset 40, and within a warp, offset 1). So it does after
// a barrier too: the order starts again from the first thread whichever arrived last. By
// default every other block runs in reverse, so one launch of two blocks shows both.
TEST(CudaEmulatorTest, ReverseOrderShowsAMissingBarrierTheOtherWayRound) {
  constexpr int kThreads = 96;
  const emu::ScheduleOrder initial = emu::GetScheduleOrder();
  std::vector<float> out(2 * kThreads);
  for (auto [offset, first] : {std::pair{1, 0}, {40, 0}, {1, 1}, {40, 1}, {1, 2}, {40, 2}}) {
    SCOPED_TRACE(testing::Message() << "offset " << offset << ", barrier first " << first);
    emu::SetScheduleOrder(emu::ScheduleOrder::kForward);
    emu::Launch(1, kThreads, kThreads * sizeof(float))(EarlierNeighbourKernel, out.data(), offset, first);
    EXPECT_EQ(CountNan(out, 0, kThreads), 0);  // what index order alone cannot see
    EXPECT_EQ(out[kThreads - 1], float(kThreads - 1 - offset));
    emu::Launch(1, kThreads, kThreads * sizeof(float))(EarlierNeighbourKernel, out.data(), -offset, first);
    EXPECT_EQ(CountNan(out, 0, kThreads - offset), kThreads - offset);
    emu::SetScheduleOrder(emu::ScheduleOrder::kReverse);
    emu::Launch(1, kThreads, kThreads * sizeof(float))(EarlierNeighbourKernel, out.data(), offset, first);
    EXPECT_EQ(CountNan(out, offset, kThreads), kThreads - offset);
    emu::Launch(1, kThreads, kThreads * sizeof(float))(EarlierNeighbourKernel, out.data(), -offset, first);
    EXPECT_EQ(CountNan(out, 0, kThreads), 0);
    emu::SetScheduleOrder(emu::ScheduleOrder::kAlternate);
    emu::Launch(2, kThreads, kThreads * sizeof(float))(EarlierNeighbourKernel, out.data(), offset, first);
    EXPECT_EQ(CountNan(out, 0, kThreads), 0);                                 // block 0: index order
    EXPECT_EQ(CountNan(out, kThreads + offset, 2 * kThreads), kThreads - offset);  // block 1: reverse
  }
  emu::SetScheduleOrder(initial);
}

void WarpKernel(const float* in, float* sum, float* bcast, float* down) {
  const int i = int(threadIdx.x);
  float v = in[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sum[i] = v;
  bcast[i] = __shfl_sync(0xffffffffu, in[i], 5);
  down[i] = __shfl_down_sync(0xffffffffu, in[i], 1);
}

TEST(CudaEmulatorTest, WarpExchangesStayWithinEachWarp) {
  constexpr int kThreads = 64;
  std::vector<float> in(kThreads), sum(kThreads), bcast(kThreads), down(kThreads);
  for (int i = 0; i < kThreads; ++i) in[i] = float(i * i % 17);
  emu::Launch(1, kThreads)(WarpKernel, in.data(), sum.data(), bcast.data(), down.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int i = 0; i < kThreads; ++i) {
    const int w = i / 32;
    float want = 0;
    for (int l = 0; l < 32; ++l) want += in[w * 32 + l];
    EXPECT_EQ(sum[i], want) << i;
    EXPECT_EQ(bcast[i], in[w * 32 + 5]) << i;
    EXPECT_EQ(down[i], i % 32 == 31 ? in[i] : in[i + 1]) << i;
  }
}

void BallotKernel(unsigned* out) { out[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0); }

TEST(CudaEmulatorTest, BallotGathersEveryLane) {
  std::vector<unsigned> out(32);
  emu::Launch(1, 32)(BallotKernel, out.data());
  unsigned want = 0;
  for (int l = 0; l < 32; l += 3) want |= 1u << l;
  for (unsigned v : out) EXPECT_EQ(v, want);
}

void NothingKernel(int) {}

TEST(CudaEmulatorTest, BadLaunchConfigurationsAreErrors) {
  emu::Launch(1, 2048)(NothingKernel, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  emu::Launch(dim3(0), 32)(NothingKernel, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  emu::Launch(1, 32, 64 << 10)(NothingKernel, 0);  // over 48 KB of dynamic shared memory
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared
}

void AddKernel(int* p, int v) { atomicAdd(p + threadIdx.x % 4, v); }

TEST(CudaEmulatorTest, CapturedWorkRunsWhenTheGraphDoes) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<int> acc(4, 0);
  int host_value = 1;
  int* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  emu::Launch(2, 64, 0, stream)(AddKernel, acc.data(), 3);
  ASSERT_EQ(cudaMemcpyAsync(dev, &host_value, sizeof(int), cudaMemcpyHostToDevice, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(acc, std::vector<int>(4, 0));  // nothing ran during the capture
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  host_value = 7;  // a graph's copy reads the host memory when it runs
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(acc, std::vector<int>(4, 2 * 2 * 16 * 3));
  int got = 0;
  ASSERT_EQ(cudaMemcpy(&got, dev, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, 7);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(dev);
  cudaStreamDestroy(stream);
  cudaGetLastError();
}

// Thread 0 waits at the block barrier while its warp's other lanes wait for it in a shuffle.
void DivergentKernel(float* out) {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  }
}

// Lanes past the end of a partial warp count as 0 (and as no ballot bit).
void PartialWarpKernel(unsigned* ballot, float* sum) {
  ballot[threadIdx.x] = __ballot_sync(0xffffffffu, 1);
  float v = 1.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sum[threadIdx.x] = v;
}

// Two groups of copies per thread: what each stage holds before the waits, after waiting for
// all but the newest group, and after waiting for everything.
void PipelineKernel(const float* src, float* seen) {
  float* s = static_cast<float*>(emu::DynamicShared());
  const int i = int(threadIdx.x), n = int(blockDim.x);
  __pipeline_memcpy_async(s + 4 * i, src + 4 * i, 16);
  __pipeline_commit();
  __pipeline_memcpy_async(s + 4 * (n + i), src + 4 * (n + i), 16, 8);  // the last 8 bytes zeros
  __pipeline_commit();
  seen[i] = s[4 * i];                 // group 0 issued, not waited for: NaN
  __pipeline_wait_prior(1);
  seen[n + i] = s[4 * i];             // group 0 landed
  seen[2 * n + i] = s[4 * (n + i)];   // group 1 not yet: NaN
  __pipeline_wait_prior(0);
  seen[3 * n + i] = s[4 * (n + i) + 1];  // landed
  seen[4 * n + i] = s[4 * (n + i) + 3];  // zero-filled
}

TEST(CudaEmulatorTest, AsyncCopiesLandAtTheirWait) {
  constexpr int kThreads = 8;
  std::vector<float> src(8 * kThreads), seen(5 * kThreads);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i + 1);
  emu::Launch(1, kThreads, src.size() * sizeof(float))(PipelineKernel, src.data(), seen.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_TRUE(std::isnan(seen[i])) << i;
    EXPECT_EQ(seen[kThreads + i], src[4 * i]) << i;
    EXPECT_TRUE(std::isnan(seen[2 * kThreads + i])) << i;
    EXPECT_EQ(seen[3 * kThreads + i], src[4 * (kThreads + i) + 1]) << i;
    EXPECT_EQ(seen[4 * kThreads + i], 0.0f) << i;
  }
}

TEST(CudaEmulatorTest, PartialWarpLanesReadAsZero) {
  std::vector<unsigned> ballot(20);
  std::vector<float> sum(20);
  emu::Launch(1, 20)(PartialWarpKernel, ballot.data(), sum.data());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(ballot[i], (1u << 20) - 1) << i;
  // The xor tree over 20 ones with 12 absent zeros: lanes 0-15 reach every present lane,
  // lanes 16-19 only 8 of them.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sum[i], i < 16 ? 20.0f : 8.0f) << i;
}

// Lanes 16-31 return before the others exchange with them.
void ExitedLaneKernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 16);
}

TEST(CudaEmulatorDeathTest, ExchangingWithAnExitedLaneIsReported) {
  std::vector<float> out(32);
  EXPECT_DEATH(emu::Launch(1, 32)(ExitedLaneKernel, out.data()), "which has exited");
}

TEST(CudaEmulatorDeathTest, DeadlockIsReported) {
  std::vector<float> out(64);
  EXPECT_DEATH(emu::Launch(1, 64)(DivergentKernel, out.data()), "emu: deadlock in block");
}

// A warp-wide matrix instruction (warp_mma.h) where lane 5 is at __syncwarp instead, or has
// exited: the warp barrier would pair them, and the emulator stops instead of reading a stale
// operand.
void SplitMmaKernel(float* out, bool exit_instead) {
  float d[4] = {};
  const uint32_t a[4] = {0x3f803f80u, 0, 0, 0};  // bf16 1.0 pairs
  if (threadIdx.x == 5) {
    if (exit_instead) return;
    __syncwarp();
  } else {
    MmaBf16M16N8K16(d, a, 0x3f803f80u, 0);
  }
  out[threadIdx.x] = d[0];
}

TEST(CudaEmulatorDeathTest, AWarpWideMatrixInstructionNeedsEveryLaneTogether) {
  std::vector<float> out(32);
  EXPECT_DEATH(emu::Launch(1, 32)(SplitMmaKernel, out.data(), false),
               "finds lane 5 elsewhere");
  EXPECT_DEATH(emu::Launch(1, 32)(SplitMmaKernel, out.data(), true), "finds lane 5 exited");
}

// ldmatrix with every row address 16-byte aligned, or (misaligned) lane 3's off by 8 bytes.
void LdMatrixKernel(uint32_t* out, bool misaligned) {
  __shared__ __align__(16) uint16_t rows[32 * 16];
  for (int i = 0; i < 16; ++i) rows[threadIdx.x * 16 + i] = uint16_t(threadIdx.x * 16 + i);
  __syncwarp();
  uint32_t r[4];
  const int offset = misaligned && threadIdx.x == 3 ? 4 : 0;
  LdMatrixX4(r, rows + threadIdx.x * 16 + offset);
  for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = r[i];
}

TEST(CudaEmulatorDeathTest, AnLdmatrixRowMustBe16ByteAligned) {
  std::vector<uint32_t> out(128);
  emu::Launch(1, 32)(LdMatrixKernel, out.data(), false);
  // Lane 4g + t: matrix i's row g, elements 2t and 2t + 1 (row r of matrix i is lane 8i + r's).
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const uint32_t first = uint32_t((8 * i + lane / 4) * 16 + 2 * (lane % 4));
      EXPECT_EQ(out[lane * 4 + i], first | (first + 1) << 16) << "lane " << lane << ", " << i;
    }
  }
  EXPECT_DEATH(emu::Launch(1, 32)(LdMatrixKernel, out.data(), true), "not 16-byte aligned");
}

// All-ones A and B: each D element sums 16 products, gathered from 8 lanes' fragments, plus C.
void OnesMmaKernel(float* out) {
  const uint32_t ones = 0x3f803f80u;  // two bf16 1.0
  float d[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  const uint32_t a[4] = {ones, ones, ones, ones};
  MmaBf16M16N8K16(d, a, ones, ones);
  for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = d[i];
}

TEST(CudaEmulatorTest, WarpMmaSumsOverTheWholeWarp) {
  std::vector<float> out(128);
  emu::Launch(1, 32)(OnesMmaKernel, out.data());
  for (float x : out) EXPECT_EQ(x, 17.0f);  // 16 products of 1 · 1, plus C
}

TEST(CudaEmulatorDeathTest, AWarpWideMatrixInstructionInAPartialWarpIsReported) {
  std::vector<float> out(128);
  // A block of 20 threads: lanes 20-31 of its warp do not exist.
  EXPECT_DEATH(emu::Launch(1, 20)(OnesMmaKernel, out.data()), "finds lane 20 missing");
}

// Each block of a cluster writes its slot of `out` (global memory), then reads the next
// block's (by rank, within the cluster) into `got`, with or without cluster.sync() between.
void ClusterNeighbourKernel(float* out, float* got, bool sync) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), n = cluster.num_blocks();
  const unsigned first = blockIdx.x - rank;  // the cluster's first block
  if (threadIdx.x == 0) out[blockIdx.x] = float(blockIdx.x * 10 + 1);
  if (sync) cluster.sync();
  if (threadIdx.x == 0) got[blockIdx.x] = out[first + (rank + 1) % n];
}

TEST(CudaEmulatorTest, ClusterSyncOrdersTheClustersBlocksAndMissingOneShows) {
  constexpr unsigned kBlocks = 12, kCluster = 4;
  for (bool sync : {true, false}) {
    std::vector<float> out(kBlocks, NAN), got(kBlocks, NAN);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kCluster;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    const cudaLaunchConfig_t config{dim3(kBlocks), dim3(64), 0, nullptr, &attr, 1};
    const uint64_t launches = emu::ClusterLaunches();
    ASSERT_EQ(cudaLaunchKernelEx(&config, ClusterNeighbourKernel, out.data(), got.data(), sync),
              cudaSuccess);
    EXPECT_EQ(emu::ClusterLaunches(), launches + 1);
    int wrong = 0;
    for (unsigned b = 0; b < kBlocks; ++b) {
      const unsigned next = b / kCluster * kCluster + (b % kCluster + 1) % kCluster;
      wrong += !(got[b] == float(next * 10 + 1));
    }
    // With the barrier every block reads its neighbour's value; without it, a block that runs
    // before its neighbour reads what was there before: all but the last of a cluster run in
    // rank order, only the last (whose neighbour is rank 0) of one run in reverse.
    if (sync) {
      EXPECT_EQ(wrong, 0);
    } else {
      EXPECT_GT(wrong, 0);
    }
  }
}

TEST(CudaEmulatorTest, ClusterAndSharedMemoryOptInLimits) {
  std::vector<float> out(16), got(16);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim = {3, 1, 1};  // does not divide 16 blocks
  cudaLaunchConfig_t config{dim3(16), dim3(32), 0, nullptr, &attr, 1};
  EXPECT_EQ(cudaLaunchKernelEx(&config, ClusterNeighbourKernel, out.data(), got.data(), true),
            cudaErrorInvalidValue);
  attr.val.clusterDim = {16, 1, 1};  // more than the portable 8
  EXPECT_EQ(cudaLaunchKernelEx(&config, ClusterNeighbourKernel, out.data(), got.data(), true),
            cudaErrorInvalidValue);
  cudaGetLastError();
  // 64 KB of dynamic shared memory only after the kernel's opt-in, and never past 227 KB.
  attr.val.clusterDim = {8, 1, 1};
  config.dynamicSmemBytes = 64 << 10;
  EXPECT_EQ(cudaLaunchKernelEx(&config, ClusterNeighbourKernel, out.data(), got.data(), true),
            cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaFuncSetAttribute(ClusterNeighbourKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 228 << 10),
            cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_EQ(cudaFuncSetAttribute(ClusterNeighbourKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 << 10),
            cudaSuccess);
  EXPECT_EQ(cudaLaunchKernelEx(&config, ClusterNeighbourKernel, out.data(), got.data(), true),
            cudaSuccess);
  for (unsigned b = 0; b < 16; ++b) EXPECT_EQ(got[b], float((b / 8 * 8 + (b + 1) % 8) * 10 + 1));
}

// Block 0 of each cluster returns before the barrier the others wait at.
void ClusterEarlyExitKernel(float* out) {
  if (cooperative_groups::this_cluster().block_rank() == 0) return;
  cooperative_groups::this_cluster().sync();
  out[blockIdx.x] = 1.0f;
}

TEST(CudaEmulatorDeathTest, ABlockEndingWhileItsClusterWaitsIsReported) {
  std::vector<float> out(4);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim = {4, 1, 1};
  const cudaLaunchConfig_t config{dim3(4), dim3(32), 0, nullptr, &attr, 1};
  EXPECT_DEATH(cudaLaunchKernelEx(&config, ClusterEarlyExitKernel, out.data()),
               "ended while the others wait at cluster.sync");
}

}  // namespace
