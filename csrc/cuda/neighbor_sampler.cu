// Route 1 neighbour sampling on the GPU (DUCATI / PyTorch-Direct): the topology stays in pinned
// host memory and is read over UVA, except the neighbour lists of hot nodes, which a device cache
// holds. Same semantics, output and argument checks (common/sampler_checks.h) as the CPU sampler
// (csrc/cpu/neighbor_sampler.cpp): uniform sampling without replacement per destination, fanouts[h]
// at hop h from the seeds (-1: all), relabelling to local ids in order of discovery (so destinations
// are a prefix of the sources), blocks input layer first. The random choices differ from the CPU's
// (another generator), their distribution does not.
//
// One hop, for the num_dst destinations found so far:
//   1. count: a thread per destination reads its degree (cache or UVA) and how many it takes;
//      an exclusive scan gives the block's indptr (one sync to size the outputs).
//   2. sample: a warp per destination writes the global ids of its chosen neighbours; Floyd's
//      algorithm (exactly `taken` draws, a warp-wide membership test) for fanouts up to
//      kFloydMaxFanout, else reservoir sampling with atomicMax per slot (Algorithm R, in parallel).
//      A destination with more than kWarpMaxDegree neighbours that takes more than kFloydMaxFanout
//      (a hub) is left to blocks instead: as many blocks per hub as its degree needs split its
//      reservoir draws (or its copy, for -1), with the same draws, so the same sample, as a warp.
//   3. relabel: each sampled id is inserted in a device hash table with value min(base + edge
//      position); an edge holding its id's minimum is the first occurrence of a new node, so a scan
//      over those flags numbers new nodes in the CPU's discovery order (deterministic, no races
//      deciding ids). New nodes get their local ids, then every edge reads its id's local id.
#include <torch/library.h>

#include <limits>
#include <tuple>
#include <vector>

#include "common/sampler_checks.h"
#include "common/sampling.h"
#include "cuda/uva.cuh"

namespace morphpipe::cuda {
namespace {

constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarp;
constexpr int64_t kEmptyKey = -1;
// Above this degree, a destination sampled by reservoir (or taken whole) is spread over blocks, not one warp.
constexpr int64_t kWarpMaxDegree = 4096;
// Neighbour offsets per block for such a hub: a hub of 10^6 neighbours gets 245 blocks.
constexpr int64_t kOffsetsPerBlock = 16 * kThreadsPerBlock;

// Whether a destination is a hub that the block kernels (heavy_*) sample instead of a warp.
__host__ __device__ __forceinline__ bool is_heavy(int64_t degree, int64_t taken) {
  return degree > kWarpMaxDegree && taken > kFloydMaxFanout;
}

// Neighbour lists: a device cache for hot nodes (slot >= 0), pinned host memory over UVA for the rest.
template <typename index_t>
struct Topology {
  const int64_t* indptr;         // [num_nodes + 1]
  const index_t* indices;        // [num_edges]
  const int32_t* slot;           // [num_nodes] cached row of each node or -1; nullptr: no cache
  const int64_t* cache_indptr;   // [num_cached + 1], device
  const index_t* cache_indices;  // device
  int64_t num_nodes;

  __device__ __forceinline__ const index_t* list(int64_t node, int64_t& degree) const {
    if (slot != nullptr) {
      const int32_t row = slot[node];
      if (row >= 0) {
        const int64_t begin = cache_indptr[row];
        degree = cache_indptr[row + 1] - begin;
        return cache_indices + begin;
      }
    }
    const int64_t begin = indptr[node];
    degree = indptr[node + 1] - begin;
    return indices + begin;
  }
};

__device__ __forceinline__ uint64_t hash_slot(int64_t key, int shift) {
  return (static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> shift;
}

// Inserts `key` (or finds it) and lowers its value to `value`; returns the slot and whether it was there.
__device__ __forceinline__ int64_t table_insert(int64_t* keys, int64_t* values, uint64_t mask, int shift, int64_t key,
                                                int64_t value, bool& existed) {
  uint64_t position = hash_slot(key, shift);
  while (true) {
    const auto previous = static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(keys + position),
                                                         static_cast<unsigned long long>(kEmptyKey),
                                                         static_cast<unsigned long long>(key)));
    if (previous == kEmptyKey || previous == key) {
      existed = previous == key;
      atomicMin(reinterpret_cast<long long*>(values + position), static_cast<long long>(value));
      return static_cast<int64_t>(position);
    }
    position = (position + 1) & mask;
  }
}

// Inserts the seeds as local ids 0..num_seeds-1, reporting ids outside the graph and repeats.
__global__ void insert_seeds_kernel(const int64_t* seeds, int64_t num_seeds, int64_t num_nodes, int64_t* keys,
                                    int64_t* values, uint64_t mask, int shift, int64_t* nodes, int64_t* status) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= num_seeds) return;
  const int64_t seed = seeds[i];
  nodes[i] = seed;
  if (seed < 0 || seed >= num_nodes) {
    report(status, kStatusSeedOutOfRange, i, seed);
    return;
  }
  bool existed;
  table_insert(keys, values, mask, shift, seed, i, existed);
  if (existed) report(status, kStatusSeedRepeated, i, seed);
}

// Re-inserts nodes[0..count) with their local ids into a larger table.
__global__ void reinsert_kernel(const int64_t* nodes, int64_t count, int64_t* keys, int64_t* values, uint64_t mask,
                                int shift) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  bool existed;
  table_insert(keys, values, mask, shift, nodes[i], i, existed);
}

// Step 1: per destination its neighbour list, degree, and how many neighbours it takes.
template <typename index_t>
__global__ void count_kernel(Topology<index_t> topology, const int64_t* nodes, int64_t num_dst, int64_t fanout,
                             int64_t* lists, int64_t* degrees, int64_t* taken) {
  const int64_t dst = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (dst >= num_dst) return;
  const int64_t node = nodes[dst];
  int64_t degree = 0;
  const index_t* list = nullptr;
  if (node >= 0 && node < topology.num_nodes) list = topology.list(node, degree);  // bad seeds are reported already
  lists[dst] = reinterpret_cast<int64_t>(list);
  degrees[dst] = degree;
  taken[dst] = (fanout < 0 || degree <= fanout) ? degree : fanout;
}

// Reads neighbour `offset` of a list, reporting (and replacing by -1) ids outside the graph.
template <typename index_t>
__device__ __forceinline__ int64_t neighbour_at(const index_t* list, int64_t offset, int64_t num_nodes,
                                                int64_t* status) {
  const auto node = static_cast<int64_t>(list[offset]);
  if (node < 0 || node >= num_nodes) {
    report(status, kStatusNeighbourOutOfRange, offset, node);
    return -1;
  }
  return node;
}

// Step 2: a warp per destination writes the global ids of its sampled neighbours into out[indptr[dst]..].
template <typename index_t>
__global__ void sample_kernel(const int64_t* lists, const int64_t* degrees, const int64_t* indptr, int64_t num_dst,
                              int64_t num_nodes, uint64_t hop_key, int64_t* out, int64_t* status) {
  __shared__ int64_t chosen_shared[kWarpsPerBlock][kFloydMaxFanout];
  const int lane = threadIdx.x % kWarp;
  const int warp_in_block = threadIdx.x / kWarp;
  int64_t* chosen = chosen_shared[warp_in_block];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t dst = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + warp_in_block; dst < num_dst; dst += warps) {
    const auto* list = reinterpret_cast<const index_t*>(lists[dst]);
    const int64_t degree = degrees[dst];
    const int64_t begin = indptr[dst];
    const int64_t taken = indptr[dst + 1] - begin;
    if (is_heavy(degree, taken)) continue;  // the heavy_* kernels sample hubs
    int64_t* target = out + begin;
    if (taken == degree) {
      for (int64_t k = lane; k < degree; k += kWarp) target[k] = neighbour_at(list, k, num_nodes, status);
      continue;
    }
    const uint64_t key = splitmix64(hop_key ^ static_cast<uint64_t>(dst));
    if (taken <= kFloydMaxFanout) {
      // Floyd: for upper in [degree - taken, degree) draw t in [0, upper]; take t unless already taken, else upper.
      int64_t count = 0;
      for (int64_t upper = degree - taken; upper < degree; ++upper, ++count) {
        const auto draw = static_cast<int64_t>(uniform_below(key, static_cast<uint64_t>(upper),
                                                             static_cast<uint64_t>(upper) + 1));
        bool seen = false;
        for (int64_t k = lane; k < count; k += kWarp) seen |= chosen[k] == draw;
        seen = __any_sync(0xFFFFFFFFu, seen);
        if (lane == 0) chosen[count] = seen ? upper : draw;
        __syncwarp();
      }
      for (int64_t k = lane; k < taken; k += kWarp) target[k] = neighbour_at(list, chosen[k], num_nodes, status);
      __syncwarp();
    } else {
      // Algorithm R: slot j keeps the last offset i that drew j, i.e. the largest, hence atomicMax.
      for (int64_t k = lane; k < taken; k += kWarp) target[k] = k;
      __syncwarp();
      for (int64_t i = taken + lane; i < degree; i += kWarp) {
        const auto j = static_cast<int64_t>(uniform_below(key, static_cast<uint64_t>(i), static_cast<uint64_t>(i) + 1));
        if (j < taken) atomicMax(reinterpret_cast<unsigned long long*>(target + j), static_cast<unsigned long long>(i));
      }
      __syncwarp();
      for (int64_t k = lane; k < taken; k += kWarp) target[k] = neighbour_at(list, target[k], num_nodes, status);
    }
  }
}

// Step 2 for hubs (grid: x = hub, y = its share of the offsets), a: slot k of the sample starts as offset k.
__global__ void heavy_init_kernel(const int64_t* hubs, const int64_t* indptr, int64_t* out) {
  const int64_t dst = hubs[blockIdx.x];
  const int64_t begin = indptr[dst], taken = indptr[dst + 1] - begin;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; k < taken; k += stride) {
    out[begin + k] = k;
  }
}

// b: Algorithm R's draws for offsets taken..degree-1 (the warp path's draws: same key, same counters).
__global__ void heavy_draw_kernel(const int64_t* hubs, const int64_t* degrees, const int64_t* indptr,
                                  uint64_t hop_key, int64_t* out) {
  const int64_t dst = hubs[blockIdx.x];
  const int64_t degree = degrees[dst], begin = indptr[dst], taken = indptr[dst + 1] - begin;
  const uint64_t key = splitmix64(hop_key ^ static_cast<uint64_t>(dst));
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t i = taken + static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < degree; i += stride) {
    const auto j = static_cast<int64_t>(uniform_below(key, static_cast<uint64_t>(i), static_cast<uint64_t>(i) + 1));
    if (j < taken) {
      atomicMax(reinterpret_cast<unsigned long long*>(out + begin + j), static_cast<unsigned long long>(i));
    }
  }
}

// c: the chosen offsets become neighbour ids.
template <typename index_t>
__global__ void heavy_finish_kernel(const int64_t* hubs, const int64_t* lists, const int64_t* indptr,
                                    int64_t num_nodes, int64_t* out, int64_t* status) {
  const int64_t dst = hubs[blockIdx.x];
  const auto* list = reinterpret_cast<const index_t*>(lists[dst]);
  const int64_t begin = indptr[dst], taken = indptr[dst + 1] - begin;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; k < taken; k += stride) {
    out[begin + k] = neighbour_at(list, out[begin + k], num_nodes, status);
  }
}

// Step 3a: every sampled id joins the table with value base + its edge position (the minimum wins).
__global__ void insert_edges_kernel(const int64_t* sampled, int64_t nnz, int64_t base, int64_t* keys, int64_t* values,
                                    uint64_t mask, int shift, int64_t* slots) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= nnz) return;
  const int64_t node = sampled[e];
  if (node < 0) {
    slots[e] = -1;
    return;
  }
  bool existed;
  slots[e] = table_insert(keys, values, mask, shift, node, base + e, existed);
}

// Step 3b: 1 where edge e is the first occurrence of a node not seen before this hop.
__global__ void first_occurrence_kernel(const int64_t* slots, const int64_t* values, int64_t nnz, int64_t base,
                                        int64_t* first) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= nnz) return;
  first[e] = slots[e] >= 0 && values[slots[e]] == base + e;
}

// Step 3c: new nodes take local ids base + (rank among first occurrences) and are appended to nodes.
__global__ void assign_kernel(const int64_t* sampled, const int64_t* slots, const int64_t* first,
                              const int64_t* inclusive_rank, int64_t nnz, int64_t base, int64_t* values,
                              int64_t* nodes) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= nnz || !first[e]) return;
  const int64_t local = base + inclusive_rank[e] - 1;
  values[slots[e]] = local;
  nodes[local] = sampled[e];
}

// Step 3d: every edge's source as a local id.
__global__ void relabel_kernel(const int64_t* slots, const int64_t* values, int64_t nnz, int64_t* out) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= nnz) return;
  out[e] = slots[e] >= 0 ? values[slots[e]] : 0;
}


// The device hash table from global to local id: keys (-1 empty) and values, a power-of-two size.
struct NodeTable {
  at::Tensor keys;
  at::Tensor values;
  uint64_t mask = 0;
  int shift = 64;

  NodeTable(int64_t entries, const at::TensorOptions& options) {
    int64_t capacity = 1024;
    while (capacity < 2 * entries) capacity *= 2;
    keys = at::full({capacity}, kEmptyKey, options);
    values = at::full({capacity}, std::numeric_limits<int64_t>::max(), options);
    mask = static_cast<uint64_t>(capacity) - 1;
    shift = 64 - __builtin_ctzll(static_cast<unsigned long long>(capacity));
  }

  int64_t capacity() const { return keys.numel(); }
};

// Throws the error a kernel recorded in `host_status` (kind, position, value), naming the input and the fix.
void raise_status(const int64_t* host_status, int64_t num_nodes) {
  const int64_t kind = host_status[0], position = host_status[1], value = host_status[2];
  if (kind == kStatusSeedOutOfRange) check_seed_id(position, value, num_nodes);
  check_seed_first(position, value, kind != kStatusSeedRepeated);
  TORCH_CHECK(kind != kStatusNeighbourOutOfRange, "graph topology: a neighbour list holds node id ", value,
              " outside [0, ", num_nodes, "); validate the graph (GraphStore.validate) before sampling");
}

// Reads `values` (small, on the device) together with the status record; one sync. Throws on a recorded error.
std::vector<int64_t> read_back(const at::Tensor& status, const std::vector<at::Tensor>& values, int64_t num_nodes) {
  std::vector<at::Tensor> parts{status};
  parts.insert(parts.end(), values.begin(), values.end());
  const at::Tensor host = at::cat(parts).cpu();
  const int64_t* data = host.data_ptr<int64_t>();
  raise_status(data, num_nodes);
  return std::vector<int64_t>(data + 3, data + host.numel());
}

template <typename index_t>
std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> sample(
    const Topology<index_t>& topology, const at::Tensor& seeds, at::IntArrayRef fanouts, int64_t seed) {
  const auto device = seeds.device();
  const auto options = seeds.options();
  const int64_t num_seeds = seeds.numel();
  const at::Tensor status = new_status(device);
  int64_t* status_data = status.data_ptr<int64_t>();
  const cudaStream_t stream = current_stream();

  NodeTable table(num_seeds, options);
  at::Tensor nodes = at::empty({std::max<int64_t>(num_seeds, 1)}, options);
  insert_seeds_kernel<<<blocks_for(num_seeds, 1), kThreadsPerBlock, 0, stream>>>(
      seeds.data_ptr<int64_t>(), num_seeds, topology.num_nodes, table.keys.data_ptr<int64_t>(),
      table.values.data_ptr<int64_t>(), table.mask, table.shift, nodes.data_ptr<int64_t>(), status_data);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const size_t num_hops = fanouts.size();
  std::vector<at::Tensor> block_indptrs(num_hops), block_indices(num_hops);
  int64_t num_known = num_seeds;
  for (size_t hop = 0; hop < num_hops; ++hop) {
    const int64_t num_dst = num_known;
    const at::Tensor lists = at::empty({num_dst}, options);
    const at::Tensor degrees = at::empty({num_dst}, options);
    const at::Tensor taken = at::empty({num_dst}, options);
    count_kernel<index_t><<<blocks_for(num_dst, 1), kThreadsPerBlock, 0, stream>>>(
        topology, nodes.data_ptr<int64_t>(), num_dst, fanouts[hop], lists.data_ptr<int64_t>(),
        degrees.data_ptr<int64_t>(), taken.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    at::Tensor indptr = at::zeros({num_dst + 1}, options);
    at::Tensor indptr_tail = indptr.narrow(0, 1, num_dst);
    at::cumsum_out(indptr_tail, taken, 0);
    // Hubs, their number and the largest hub degree come back with nnz, in the same sync.
    const at::Tensor hub_mask = at::logical_and(degrees > kWarpMaxDegree, taken > kFloydMaxFanout);
    std::vector<at::Tensor> wanted{indptr.narrow(0, num_dst, 1)};
    if (num_dst > 0) {
      wanted.push_back(hub_mask.sum().to(at::kLong).reshape({1}));
      wanted.push_back((degrees * hub_mask).amax().reshape({1}));
    }
    const std::vector<int64_t> sizes = read_back(status, wanted, topology.num_nodes);
    const int64_t nnz = sizes[0], num_hubs = num_dst > 0 ? sizes[1] : 0, hub_degree = num_dst > 0 ? sizes[2] : 0;
    TORCH_CHECK(num_known + nnz < std::numeric_limits<int32_t>::max(),
                "one batch would hold more than 2^31 nodes; use a smaller batch_size or smaller fanouts");

    at::Tensor sampled = at::empty({nnz}, options);
    const uint64_t hop_key = splitmix64(splitmix64(static_cast<uint64_t>(seed)) ^ (static_cast<uint64_t>(hop) + 1));
    if (nnz > 0) {
      const auto blocks = static_cast<unsigned>(
          std::min<int64_t>((num_dst + kWarpsPerBlock - 1) / kWarpsPerBlock, 1 << 20));  // a warp per destination
      sample_kernel<index_t><<<blocks, kThreadsPerBlock, 0, stream>>>(
          lists.data_ptr<int64_t>(), degrees.data_ptr<int64_t>(), indptr.data_ptr<int64_t>(), num_dst,
          topology.num_nodes, hop_key, sampled.data_ptr<int64_t>(), status_data);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (num_hubs > 0) {
      const at::Tensor hubs = at::nonzero_static(hub_mask, num_hubs).view({-1});
      const int64_t shares = std::min<int64_t>((hub_degree + kOffsetsPerBlock - 1) / kOffsetsPerBlock, 65535);
      const dim3 grid(static_cast<unsigned>(num_hubs), static_cast<unsigned>(std::max<int64_t>(shares, 1)));
      heavy_init_kernel<<<grid, kThreadsPerBlock, 0, stream>>>(hubs.data_ptr<int64_t>(), indptr.data_ptr<int64_t>(),
                                                               sampled.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      heavy_draw_kernel<<<grid, kThreadsPerBlock, 0, stream>>>(hubs.data_ptr<int64_t>(), degrees.data_ptr<int64_t>(),
                                                               indptr.data_ptr<int64_t>(), hop_key,
                                                               sampled.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      heavy_finish_kernel<index_t><<<grid, kThreadsPerBlock, 0, stream>>>(
          hubs.data_ptr<int64_t>(), lists.data_ptr<int64_t>(), indptr.data_ptr<int64_t>(), topology.num_nodes,
          sampled.data_ptr<int64_t>(), status_data);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }

    // At most min(num_known + nnz, num_nodes) distinct nodes after this hop: size table and buffer for that.
    const int64_t bound = std::min(num_known + nnz, topology.num_nodes);
    if (table.capacity() < 2 * bound) {
      NodeTable larger(bound, options);
      reinsert_kernel<<<blocks_for(num_known, 1), kThreadsPerBlock, 0, stream>>>(
          nodes.data_ptr<int64_t>(), num_known, larger.keys.data_ptr<int64_t>(), larger.values.data_ptr<int64_t>(),
          larger.mask, larger.shift);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      table = std::move(larger);
    }
    if (nodes.numel() < bound) {
      at::Tensor grown = at::empty({std::max(bound, std::min(2 * nodes.numel(), topology.num_nodes))}, options);
      grown.narrow(0, 0, num_known).copy_(nodes.narrow(0, 0, num_known));
      nodes = std::move(grown);
    }

    const at::Tensor slots = at::empty({nnz}, options);
    const at::Tensor first = at::empty({nnz}, options);
    at::Tensor local = at::empty({nnz}, options);
    int64_t num_new = 0;
    if (nnz > 0) {
      insert_edges_kernel<<<blocks_for(nnz, 1), kThreadsPerBlock, 0, stream>>>(
          sampled.data_ptr<int64_t>(), nnz, num_known, table.keys.data_ptr<int64_t>(), table.values.data_ptr<int64_t>(),
          table.mask, table.shift, slots.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      first_occurrence_kernel<<<blocks_for(nnz, 1), kThreadsPerBlock, 0, stream>>>(
          slots.data_ptr<int64_t>(), table.values.data_ptr<int64_t>(), nnz, num_known, first.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      const at::Tensor rank = at::cumsum(first, 0);
      num_new = read_back(status, {rank.narrow(0, nnz - 1, 1)}, topology.num_nodes)[0];
      assign_kernel<<<blocks_for(nnz, 1), kThreadsPerBlock, 0, stream>>>(
          sampled.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), first.data_ptr<int64_t>(), rank.data_ptr<int64_t>(),
          nnz, num_known, table.values.data_ptr<int64_t>(), nodes.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      relabel_kernel<<<blocks_for(nnz, 1), kThreadsPerBlock, 0, stream>>>(
          slots.data_ptr<int64_t>(), table.values.data_ptr<int64_t>(), nnz, local.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const size_t layer = num_hops - 1 - hop;  // hop 0 (around the seeds) is the last layer
    block_indptrs[layer] = std::move(indptr);
    block_indices[layer] = std::move(local);
    num_known += num_new;
  }
  // The buffer grows by doubling: hand out a copy of its used part rather than a view that keeps it all alive.
  at::Tensor input_nodes = nodes.numel() == num_known ? nodes : nodes.narrow(0, 0, num_known).clone();
  return {input_nodes, block_indptrs, block_indices};
}

std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> sample_neighbors_cached_cuda(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds, at::IntArrayRef fanouts,
    int64_t seed, const at::Tensor& cache_slot, const at::Tensor& cache_indptr, const at::Tensor& cache_indices) {
  constexpr const char* op = "morphpipe::sample_neighbors";
  TORCH_CHECK(seeds.is_cuda(), op, ": seeds must be a CUDA tensor (the device that samples), got ", seeds.device());
  check_seeds(seeds, op);
  check_topology(indptr, indices);
  check_fanouts(fanouts);
  const auto device = seeds.device();
  const c10::cuda::CUDAGuard guard(device);
  const int64_t num_nodes = indptr.numel() - 1;
  const bool cached = cache_slot.numel() > 0;
  if (cached) check_adjacency_cache(cache_slot, cache_indptr, cache_indices, indices, num_nodes, op);
  const at::Tensor seeds_contiguous = seeds.contiguous();
  const auto* indptr_address = static_cast<const int64_t*>(device_address(indptr, device, op, "indptr"));
  const void* indices_address = device_address(indices, device, op, "indices");
  const int32_t* slot = cached ? static_cast<const int32_t*>(device_address(cache_slot, device, op, "cache_slot"))
                               : nullptr;
  const auto* cached_indptr =
      cached ? static_cast<const int64_t*>(device_address(cache_indptr, device, op, "cache_indptr")) : nullptr;
  const void* cached_indices = cached ? device_address(cache_indices, device, op, "cache_indices") : nullptr;
  if (indices.scalar_type() == at::kInt) {
    const Topology<int32_t> topology{indptr_address, static_cast<const int32_t*>(indices_address), slot, cached_indptr,
                                     static_cast<const int32_t*>(cached_indices), num_nodes};
    return sample(topology, seeds_contiguous, fanouts, seed);
  }
  const Topology<int64_t> topology{indptr_address, static_cast<const int64_t*>(indices_address), slot, cached_indptr,
                                   static_cast<const int64_t*>(cached_indices), num_nodes};
  return sample(topology, seeds_contiguous, fanouts, seed);
}

std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> sample_neighbors_cuda(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds, at::IntArrayRef fanouts,
    int64_t seed) {
  const at::Tensor none = at::empty({0}, seeds.options().dtype(at::kInt));
  return sample_neighbors_cached_cuda(indptr, indices, seeds, fanouts, seed, none, none, none);
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CUDA, m) {
  m.impl("sample_neighbors", &sample_neighbors_cuda);
  m.impl("sample_neighbors_cached", &sample_neighbors_cached_cuda);
}

}  // namespace morphpipe::cuda
