// The Hopper (sm_90a) FlashAttention forward, warp-specialized (HOPPER.md §2):
//  - warpgroup 0, the producer, gives most of its registers away and one thread issues every
//    load by TMA: Q once per tile, K and V block by block into rings of kStages slots, each slot
//    with a full barrier (transaction bytes) and an empty one (an arrival per consumer);
//  - the consumer warpgroups (two or three) own 64 query rows each and run S = Q K^T (both from
//    shared memory) and O += P V (P from registers) on wgmma. Within a warpgroup the next
//    block's S is issued before this block's P V, so the softmax of one block runs while the
//    tensor cores work on the other; across warpgroups named barriers take turns so one's
//    softmax runs under the other's GEMMs (pingpong);
//  - O is normalized, staged swizzled in shared memory and written by TMA; LSE from registers;
//  - the grid is persistent: each CTA walks the tiles of common::TileScheduler.
// The parts every kernel shares (mask, online softmax, epilogue, scheduler) are in common/.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/common/epilogue.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/repair.cuh"
#include "cuda/common/scheduler.cuh"
#include "cuda/common/score_mod.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/flash/params.hpp"
#include "cuda/sm90/fwd_config.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tensor_map.hpp"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/wgmma_util.cuh"

namespace flashattn {
namespace sm90 {

// The kernel's one parameter (a __grid_constant__, so the tensor maps are addressable).
struct FwdTmaArgs {
  CUtensorMap q, k, v, o;
  cuda::FwdParams p;
  common::TileScheduler sched;
};

// One tile as the producer and the consumers both see it: its coordinates, its first query
// row, the key blocks [n_begin, n_end) the mask leaves it, and where its rows are in the tensor
// maps. A packed variable-length batch is one entry of the maps (batch coordinate 0) whose
// rows are the sequences' rows one after another; a tile past its sequence's last query
// (the grid covers the longest) loads nothing and stores nothing.
template <int kBlockM, int kBlockN>
struct FwdTile {
  common::TileCoord coord;
  common::SeqlenInfo seq;
  common::WindowMask mask;
  int m0, n_begin, n_end;
  int map_batch;  // the batch coordinate in the tensor maps
  __device__ FwdTile(const cuda::FwdParams& p, const common::TileScheduler& sched, int tile)
      : coord(sched.at(tile)),
        seq(p, coord.batch),
        mask(common::mask_of(p, seq)),
        m0(coord.m_block * kBlockM),
        map_batch(p.cu_seqlens_q != nullptr ? 0 : coord.batch) {
    mask.n_block_range(m0, kBlockM, kBlockN, n_begin, n_end);
    if (m0 >= seq.seqlen_q) n_end = n_begin;  // past its sequence's last query
  }
  // The tensor maps' row of query row r and of key row r of this tile's sequence.
  __device__ int q_row(int r) const { return seq.offset_q + r; }
  __device__ int k_row(int r) const { return seq.offset_k + r; }
};

template <class T, int kHeadDim, bool kLongRows>
__global__ void __launch_bounds__(FwdConfig<kHeadDim, kLongRows>::kNThreads, 1)
    fwd_kernel(const __grid_constant__ FwdTmaArgs args) {
#ifdef FLASHATTN_SM90A_DEVICE
  using Cfg = FwdConfig<kHeadDim, kLongRows>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kStages = Cfg::kStages;
  constexpr int kQStages = Cfg::kQStages;
  constexpr int kConsumers = Cfg::kConsumers;
  constexpr int kColBlocks = Cfg::kColBlocks;
  constexpr int kNTiles = kBlockN / 8;   // n8 tiles of S per warp
  constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O per warp
  constexpr int kKSteps = kBlockN / 16;  // k16 steps of P V
  constexpr int kSlab = 64 * 128;        // bytes of 64 rows of one 64-column block
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = common::smem_align1024(smem_raw);
  T* sQ = reinterpret_cast<T*>(base + Cfg::kOffQ);
  T* sK = reinterpret_cast<T*>(base + Cfg::kOffK);
  T* sV = reinterpret_cast<T*>(base + Cfg::kOffV);
  T* sO = reinterpret_cast<T*>(base + Cfg::kOffO);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(base + Cfg::kOffBarriers);
  uint64_t* q_empty = q_full + kQStages;
  uint64_t* k_full = q_empty + kQStages;
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;

  const cuda::FwdParams& p = args.p;
  const common::TileScheduler& sched = args.sched;
  const int num_tiles = static_cast<int>(sched.num_tiles());
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kQStages; ++s) {
      mbar_init(q_full + s, 1);
      mbar_init(q_empty + s, kConsumers);
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(k_empty + s, kConsumers);
      mbar_init(v_full + s, 1);
      mbar_init(v_empty + s, kConsumers);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&args.q);
    prefetch_tensor_map(&args.k);
    prefetch_tensor_map(&args.v);
    prefetch_tensor_map(&args.o);
    RingSlot<kStages> kv;
    RingSlot<kQStages> q;
    // One block's K or V rows into a ring slot: one box per 64-column block.
    auto load_kv = [&](const CUtensorMap* map, T* ring, uint64_t* full, int slot, int row,
                       int head_kv, int batch) {
      mbar_arrive_expect_tx(full + slot, Cfg::kKVBytes);
#pragma unroll
      for (int cb = 0; cb < kColBlocks; ++cb) {
        tma_load_4d(ring + slot * TileKV::kElems + cb * kBlockN * 64, map, full + slot,
                    cb * kTmaBoxCols, row, head_kv, batch);
      }
    };
    for (int round = 0;; ++round) {
      const int tile = sched.nth_tile(blockIdx.x, round, gridDim.x);
      if (tile >= num_tiles) break;
      const FwdTile<kBlockM, kBlockN> w(p, sched, tile);
      const common::TileCoord& c = w.coord;
      const int m0 = w.m0, n_begin = w.n_begin, n_end = w.n_end;
      const int head_kv = c.head / p.group;

      mbar_wait(q_empty + q.index, q.phase ^ 1);
      if (n_end > n_begin) {
        mbar_arrive_expect_tx(q_full + q.index, Cfg::kQBytes);
#pragma unroll
        for (int cb = 0; cb < kColBlocks; ++cb) {
          tma_load_4d(sQ + q.index * TileQ::kElems + cb * kBlockM * 64, &args.q, q_full + q.index,
                      cb * kTmaBoxCols, w.q_row(m0), c.head, w.map_batch);
        }
      } else {
        mbar_arrive(q_full + q.index);  // nothing to load: the consumers write the empty block
      }
      q.advance();

      // K of block i, then V of block i - 1: the order the consumers use them in.
      RingSlot<kStages> prev;
      for (int n = n_end - 1; n >= n_begin; --n) {
        mbar_wait(k_empty + kv.index, kv.phase ^ 1);
        load_kv(&args.k, sK, k_full, kv.index, w.k_row(n * kBlockN), head_kv, w.map_batch);
        if (n < n_end - 1) {
          mbar_wait(v_empty + prev.index, prev.phase ^ 1);
          load_kv(&args.v, sV, v_full, prev.index, w.k_row((n + 1) * kBlockN), head_kv,
                  w.map_batch);
        }
        prev = kv;
        kv.advance();
      }
      if (n_end > n_begin) {
        mbar_wait(v_empty + prev.index, prev.phase ^ 1);
        load_kv(&args.v, sV, v_full, prev.index, w.k_row(n_begin * kBlockN), head_kv,
                w.map_batch);
      }
    }
  } else {
    // ---- consumers ----
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    // Read through a shuffle so the compiler knows it is the same in every lane: a branch on it
    // (the packed batch's row store below) is then not divergent, and ptxas keeps the wgmmas
    // asynchronous (with threadIdx.x / 128 it serialized them, C7520: 626 -> 458 TFLOP/s).
    const int cwg = __shfl_sync(0xffffffffu, wg, 0) - 1;
    const int tid = threadIdx.x - 128 * wg;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const bool leader = tid == 0;  // arrives on the empty barriers, issues the O store
    // Pingpong: the warpgroups issue their GEMMs in turn, round robin from warpgroup 0, each
    // waiting on its own barrier and handing the turn on after issuing, so one's softmax runs
    // under the others' GEMMs. The turn runs on across tiles: the last warpgroup hands it to
    // warpgroup 0 once its last P V of a tile is issued, so the next tile's first S runs under
    // that P V and the last warpgroup's epilogue (handing it on only at the next tile's start
    // left the tensor cores idle for an epilogue per tile).
    const int turn_self = kFirstNamedBarrier + cwg;
    const int turn_next = kFirstNamedBarrier + (cwg + 1) % kConsumers;
    const bool last_in_turn = cwg == kConsumers - 1;
    const int wg_barrier = kFirstNamedBarrier + kConsumers + cwg;  // this warpgroup's threads
    constexpr int kTurnThreads = 256;  // the waiting warpgroup and the one handing on

    const uint32_t k_addr = common::smem_u32(sK);
    // V's ring slot 0 as the B operand of P V; a slot and k-step offset it (smem_desc_plus).
    const uint64_t v_desc0 = smem_desc(common::smem_u32(sV), kBlockN * 128, 1024);
    RingSlot<kStages> kv;
    RingSlot<kQStages> q;
    if (last_in_turn) named_barrier_arrive(turn_next, kTurnThreads);  // the first tile's turn

    auto gemm_qk = [&](float(&acc)[kBlockN / 2], int q_slot, int slot) {
      // This warpgroup's 64 rows of the Q slot.
      const uint32_t q_addr = common::smem_u32(sQ) + q_slot * Cfg::kQBytes + cwg * kSlab;
      wgmma_ss_k<T, kBlockN, kHeadDim>(acc, q_addr, kBlockM * 128,
                                       k_addr + slot * Cfg::kKVBytes, kBlockN * 128);
    };
    auto gemm_pv = [&](float(&acc)[kHeadDim / 2], const uint32_t(&pa)[kKSteps][4], int slot) {
      const uint64_t v_desc = smem_desc_plus(v_desc0, slot * Cfg::kKVBytes);
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        wgmma_rs<T, kHeadDim>(acc, pa[kk], smem_desc_plus(v_desc, kk * 2048), 1);
      }
    };
    auto pack_p = [&](uint32_t(&pa)[kKSteps][4], const float(&acc)[kBlockN / 2]) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pa[kk][i] = common::pack2<T>(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
        }
    };

    for (int round = 0;; ++round) {
      const int tile = sched.nth_tile(blockIdx.x, round, gridDim.x);
      if (tile >= num_tiles) break;
      const FwdTile<kBlockM, kBlockN> w(p, sched, tile);
      const common::TileCoord& c = w.coord;
      const common::SeqlenInfo& seq = w.seq;
      const common::WindowMask& mask = w.mask;
      const int m0 = w.m0, n_begin = w.n_begin, n_end = w.n_end;
      // The blocks that need no mask: for this warpgroup's 64 rows where it keeps its own
      // blocks (a causal tile's lower rows see whole blocks its upper rows see in part).
      int full_begin, full_end;
      if constexpr (Cfg::kOwnBlocks) {
        mask.unmasked_blocks(m0 + 64 * cwg, 64, kBlockN, full_begin, full_end);
      } else {
        mask.unmasked_blocks(m0, kBlockM, kBlockN, full_begin, full_end);
      }
      const int row_in_tile = 64 * cwg + 16 * warp + g;  // this thread's first row
      const int row0 = m0 + row_in_tile;
      // With a softcap or ALiBi the scores become log2 logits before the softmax (scale 1).
      const common::ScoreMod mod = common::score_mod_of(p, c.batch, c.head, mask);
      const float softmax_scale = mod.active() ? 1.0f : p.scale_log2;
      const bool neg_scale = softmax_scale < 0.0f;
      const float hidden = common::hidden_score(neg_scale);

      float acc_o[kHeadDim / 2];
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.0f;
      common::OnlineSoftmax<1> softmax;
      softmax.reset();

      mbar_wait(q_full + q.index, q.phase);
      // This warpgroup's own key blocks [own_begin, own_end): where Cfg::kOwnBlocks, its 64 rows
      // may see fewer than the tile's (the upper rows of a causal tile, rows past the sequence's
      // end, a window's edge). It passes the others: their K and V slots released once loaded,
      // its turn taken without a GEMM, so the rings and the turns stay in step with the other
      // warpgroups. (The turn is handed on before V is waited for: the next S needs only K.)
      int own_begin = n_begin, own_end = n_end;
      auto pass_block = [&]() {
        mbar_wait(k_full + kv.index, kv.phase);
        if (leader) mbar_arrive(k_empty + kv.index);
        named_barrier_sync(turn_self, kTurnThreads);
        named_barrier_arrive(turn_next, kTurnThreads);
        mbar_wait(v_full + kv.index, kv.phase);
        if (leader) mbar_arrive(v_empty + kv.index);
        kv.advance();
      };
      if constexpr (Cfg::kOwnBlocks) {
        own_end = n_begin;  // none, unless its rows see some
        const int own_rows = min(64, max(0, seq.seqlen_q - (m0 + 64 * cwg)));
        if (n_end > n_begin && own_rows > 0) {
          mask.n_block_range(m0 + 64 * cwg, own_rows, kBlockN, own_begin, own_end);
          own_begin = max(own_begin, n_begin);
          own_end = min(own_end, n_end);
          if (own_end <= own_begin) own_begin = own_end = n_begin;
        }
        for (int n = n_end - 1; n >= own_end; --n) pass_block();
      }
      if (own_end > own_begin) {
        float acc_s[kBlockN / 2];
        uint32_t pa[kKSteps][4];
        float corr[2];

        // The last key block: S alone.
        int n = own_end - 1;
        mbar_wait(k_full + kv.index, kv.phase);
        named_barrier_sync(turn_self, kTurnThreads);
        wgmma_fence();
        gemm_qk(acc_s, q.index, kv.index);
        wgmma_commit();
        named_barrier_arrive(turn_next, kTurnThreads);
        wgmma_wait<0>();
        fence_registers(acc_s);
        if (leader) mbar_arrive(k_empty + kv.index);
        if (mod.active()) mod.apply<1, kNTiles, true>(acc_s, row0, n * kBlockN + 2 * t);
        if (n < full_begin || n >= full_end) {
          mask.apply<1, kNTiles>(acc_s, row0, n * kBlockN + 2 * t, hidden);
        }
        softmax.update<kNTiles>(acc_s, softmax_scale, neg_scale, corr);
        pack_p(pa, acc_s);
        RingSlot<kStages> v_slot = kv;
        kv.advance();

        // Each further block: issue its S, then P V of the block before; softmax under both.
        for (n = own_end - 2; n >= own_begin; --n) {
          mbar_wait(k_full + kv.index, kv.phase);
          fence_registers(pa);  // P is packed before the fence that orders it for the wgmma
          named_barrier_sync(turn_self, kTurnThreads);
          wgmma_fence();
          gemm_qk(acc_s, q.index, kv.index);
          wgmma_commit();
          mbar_wait(v_full + v_slot.index, v_slot.phase);
          gemm_pv(acc_o, pa, v_slot.index);
          wgmma_commit();
          named_barrier_arrive(turn_next, kTurnThreads);
          wgmma_wait<1>();  // S is done, P V may still run
          fence_registers(acc_s);
          if (leader) mbar_arrive(k_empty + kv.index);
          if (mod.active()) mod.apply<1, kNTiles, true>(acc_s, row0, n * kBlockN + 2 * t);
          if (n < full_begin || n >= full_end) {
            mask.apply<1, kNTiles>(acc_s, row0, n * kBlockN + 2 * t, hidden);
          }
          softmax.update<kNTiles>(acc_s, softmax_scale, neg_scale, corr);
          wgmma_wait<0>();
          fence_registers(acc_o);
          fence_registers(pa);
          if (leader) mbar_arrive(v_empty + v_slot.index);
          common::scale_rows<1, kDTiles>(acc_o, corr);
          pack_p(pa, acc_s);
          v_slot = kv;
          kv.advance();
        }

        // P V of the first key block.
        mbar_wait(v_full + v_slot.index, v_slot.phase);
        fence_registers(pa);
        named_barrier_sync(turn_self, kTurnThreads);
        wgmma_fence();
        gemm_pv(acc_o, pa, v_slot.index);
        wgmma_commit();
        // The turn goes on; from the last warpgroup, to warpgroup 0's next tile. (One
        // unconditional arrive here made ptxas serialize the wgmmas, C7520; two branches do not.)
        if (!last_in_turn) named_barrier_arrive(turn_next, kTurnThreads);
        if (last_in_turn) named_barrier_arrive(turn_next, kTurnThreads);
        wgmma_wait<0>();
        fence_registers(acc_o);
        if (leader) mbar_arrive(v_empty + v_slot.index);
      }
      if constexpr (Cfg::kOwnBlocks) {
        for (int n = own_begin - 1; n >= n_begin; --n) pass_block();
        if (n_end > n_begin && own_end <= own_begin) {
          // Without blocks of its own it has taken one turn per block: the turn its last P V
          // would have taken remains.
          named_barrier_sync(turn_self, kTurnThreads);
          named_barrier_arrive(turn_next, kTurnThreads);
        }
      }
      // With its own O tile, Q is free once the GEMMs are done: the next tile's Q loads under
      // this epilogue.
      if (!Cfg::kOAliasQ && leader) mbar_arrive(q_empty + q.index);

      // ---- epilogue ----
      float inv[2], lse[2];
      softmax.finalize(inv, lse, common::sink_log2_of(p, c.head));
      if (!Cfg::kOAliasQ) {
        if (leader) common::bulk_wait_read();  // the last tile's store has read sO
        named_barrier_sync(wg_barrier, 128);
      }
      T* stage = Cfg::kOAliasQ ? sQ + q.index * TileQ::kElems : sO;
      common::write_o_fragment<T, TileQ, 1, kDTiles>(stage, acc_o, inv, row_in_tile, t);
      common::repair_spoiled_rows<T, TileQ, kHeadDim, 1, kDTiles>(p, c.batch, c.head, m0,
                                                                  row_in_tile, acc_o, inv, lse,
                                                                  stage);
      common::fence_proxy_async();
      named_barrier_sync(wg_barrier, 128);
      // This warpgroup's 64 rows: by TMA, which clips at the maps' last row; but in a packed
      // batch the rows past a sequence's end are the next sequence's, so a warpgroup whose rows
      // end inside its sequence stores the rows that exist itself.
      // (Rows read again here: held across the main loop they would cost registers it needs.)
      const common::SeqlenInfo rows_of(p, c.batch);
      const int wg_m0 = m0 + 64 * cwg;
      const int wg_rows = rows_of.seqlen_q - wg_m0;
      const bool by_threads = p.cu_seqlens_q != nullptr && wg_rows < 64;
      if (by_threads && wg_rows > 0) {
        common::store_rows<TileQ, 128>(
            static_cast<T*>(p.o) + c.head * p.o_head_stride +
                int64_t(rows_of.offset_q + wg_m0) * p.o_row_stride,
            p.o_row_stride, stage, 64 * cwg, wg_rows, p.head_dim_v, tid);
        named_barrier_sync(wg_barrier, 128);  // every read of the staged rows is done
      }
      if (leader) {
        if (!by_threads && m0 < rows_of.seqlen_q) {
#pragma unroll
          for (int cb = 0; cb < kColBlocks; ++cb) {
            tma_store_4d(&args.o, stage + cb * kBlockM * 64 + cwg * 64 * 64, cb * kTmaBoxCols,
                         rows_of.offset_q + wg_m0, c.head,
                         p.cu_seqlens_q != nullptr ? 0 : c.batch);
          }
          bulk_commit();
        }
        if (Cfg::kOAliasQ) {
          common::bulk_wait_read();  // O staged in the Q tile: free it for the next Q
          mbar_arrive(q_empty + q.index);
        }
      }
      if (p.lse != nullptr) {
        float* lse_rows = p.lse + c.batch * p.lse_batch_stride + c.head * p.lse_head_stride +
                          int64_t(rows_of.offset_q + m0) * p.lse_row_stride;
        common::write_lse<1>(lse_rows, p.lse_row_stride, lse, row_in_tile,
                             rows_of.seqlen_q - m0, t);
      }
      q.advance();
    }
    // The turn the last warpgroup handed on after its last tile has no taker: warpgroup 0 takes
    // it, so that no named barrier is left half arrived.
    if (cwg == 0) named_barrier_sync(turn_self, kTurnThreads);
    if (leader) common::bulk_wait_all();  // shared memory must outlive the last store
  }
#endif
}

// Tiles of more query rows do enough math per K/V byte that reading K/V again costs them less
// than side by side's looser balance (d64 on 192 rows: 3-4 % slower side by side at 512-2k keys
// causal, while 128-row tiles gained 9-19 %; kernel log run 82): they keep longest first.
constexpr int kSideBySideMaxRows = 128;

// The order of the tiles. No right bound: every tile of a head costs alike, taken side by side
// (neighbours share K/V in L2). A right bound (causal) makes later query blocks longer: see
// common::side_by_side_if_balanced.
template <class Cfg>
common::TileOrder tile_order(const cuda::FwdParams& p, const common::TileScheduler& sched,
                             int grid) {
  if (p.window_right < 0) return common::TileOrder::kHeadMajor;
  if (Cfg::kBlockM > kSideBySideMaxRows) return common::TileOrder::kLongestFirst;
  const common::WindowMask mask(p.seqlen_q, p.seqlen_k, p.window_left, p.window_right);
  return common::side_by_side_if_balanced(sched, grid, [&](int m) {
    int begin, end;
    mask.n_block_range(m * Cfg::kBlockM, Cfg::kBlockM, Cfg::kBlockN, begin, end);
    return end - begin;
  });
}

// Encodes the tensor maps and launches a persistent grid of one tile. cudaErrorNotSupported
// when the driver cannot describe a view (the dispatcher then takes the sm80 kernel).
template <class T, int kHeadDim, bool kLongRows>
cudaError_t launch_fwd_tile(const cuda::FwdParams& p, const cuda::LaunchInfo& info,
                            cudaStream_t stream) {
  using Cfg = FwdConfig<kHeadDim, kLongRows>;
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  // A TMA store past a row's last column writes the rest of its 16-byte granule (measured on
  // the H200: head_dim 33 in rows padded to 40 had columns 33..39 overwritten), so rows that
  // end inside a granule go to the sm80 kernel, which stores them element by element.
  if (p.head_dim % kTmaGranuleElems != 0 || p.head_dim_v % kTmaGranuleElems != 0) {
    return cudaErrorNotSupported;
  }
  FwdTmaArgs args{};
  args.p = p;
  // A packed variable-length batch is one entry of total rows (FwdTile).
  const bool packed = p.cu_seqlens_q != nullptr;
  const int64_t rows_q = packed ? p.total_q : p.seqlen_q;
  const int64_t rows_k = packed ? p.total_k : p.seqlen_k;
  const int64_t entries = packed ? 1 : p.batch;
  const TensorMapView q{p.q, kBf16, p.head_dim, rows_q, p.heads_q, entries,
                        p.q_row_stride, p.q_head_stride, p.q_batch_stride};
  const TensorMapView k{p.k, kBf16, p.head_dim, rows_k, p.heads_kv, entries,
                        p.k_row_stride, p.k_head_stride, p.k_batch_stride};
  const TensorMapView v{p.v, kBf16, p.head_dim_v, rows_k, p.heads_kv, entries,
                        p.v_row_stride, p.v_head_stride, p.v_batch_stride};
  const TensorMapView o{p.o, kBf16, p.head_dim_v, rows_q, p.heads_q, entries,
                        p.o_row_stride, p.o_head_stride, p.o_batch_stride};
  if (!encode_tensor_map(&args.q, q, Cfg::kBlockM) ||
      !encode_tensor_map(&args.k, k, Cfg::kBlockN) ||
      !encode_tensor_map(&args.v, v, Cfg::kBlockN) ||
      !encode_tensor_map(&args.o, o, Cfg::kBlockM / Cfg::kConsumers)) {
    return cudaErrorNotSupported;
  }
  args.sched.num_m_blocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  args.sched.heads = p.heads_q;
  args.sched.batch = p.batch;
  const int64_t tiles = args.sched.num_tiles();
  if (tiles > INT32_MAX) return cudaErrorNotSupported;
  if (tiles == 0) return cudaSuccess;
  const int grid = static_cast<int>(tiles < info.sm_count ? tiles : info.sm_count);
  args.sched.order = tile_order<Cfg>(p, args.sched, grid);

  auto kernel = fwd_kernel<T, kHeadDim, kLongRows>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<grid, Cfg::kNThreads, Cfg::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

// The keys a query row sees on average from which a head dim with a long-row tile takes it:
// at d96/d112, three warpgroups of 192-row tiles gained 6-11 % at 4k-16k keys a row and lost
// 5-20 % at 512-1k (kernel log, run 125).
constexpr int64_t kLongRowKeys = 3072;

// The forward of one head dim: its long-row tile where it has one and the rows see at least
// kLongRowKeys keys on average (a packed batch: its longest sequences'), else the table's.
template <class T, int kHeadDim>
cudaError_t launch_fwd(const cuda::FwdParams& p, const cuda::LaunchInfo& info,
                       cudaStream_t stream) {
  if constexpr (FwdHasLongRowTile<kHeadDim>::value) {
    const common::WindowMask mask(p.seqlen_q, p.seqlen_k, p.window_left, p.window_right);
    if (mask.mean_visible_keys() >= kLongRowKeys) {
      return launch_fwd_tile<T, kHeadDim, true>(p, info, stream);
    }
  }
  return launch_fwd_tile<T, kHeadDim, false>(p, info, stream);
}

}  // namespace sm90
}  // namespace flashattn
