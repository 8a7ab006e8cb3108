// The Hopper forward's CTA: a producer warpgroup and two or three consumer warpgroups of 64
// query rows, Q once per tile (in one or two slots), K and V through rings of kStages slots, O
// staged in shared memory for its bulk store. Tile shapes come from the kernel table
// (lib/cuda/generate.py), some head dims with a second tile for rows that see many keys
// (kLongRows); what they imply for shared memory is computed here, once.
#pragma once

#include "cuda/common/tile.cuh"
#include "cuda/sm90/fwd_tiles.inc"

namespace flashattn {
namespace sm90 {

template <int kHeadDim_, bool kLongRows = false>
struct FwdConfig {
  using Tiles = FwdTiles<kHeadDim_, kLongRows>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumers = Tiles::kConsumers;  // consumer warpgroups
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = Tiles::kBlockN;
  static constexpr int kStages = Tiles::kStages;
  static constexpr int kNThreads = 128 * (1 + kConsumers);
  // Whether a warpgroup's 64 rows can see fewer key blocks than its tile's (the upper rows of a
  // causal tile): only where a key block does not span whole tiles. Elsewhere the per-warpgroup
  // block range would cost code and never skip a block (d128: 3-4 % slower at causal 1k-2k,
  // kernel log run 84).
  static constexpr bool kOwnBlocks = kBlockN % kBlockM != 0;

  // setmaxnreg budgets: the entry budget (the register file over the threads, in steps of 8)
  // shifted from the producer, which needs few, to the consumers.
  static constexpr int kEntryRegs = (65536 / kNThreads > 255 ? 255 : 65536 / kNThreads) / 8 * 8;
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs =
      ((kEntryRegs * kNThreads - kProducerRegs * 128) / (128 * kConsumers)) / 8 * 8;

  using TileQ = common::SwizzledTile<kBlockM, kHeadDim>;  // also the O staging tile
  using TileKV = common::SwizzledTile<kBlockN, kHeadDim>;
  static constexpr int kColBlocks = TileQ::kColBlocks;  // 64-column boxes per row
  static constexpr int kQBytes = TileQ::kElems * 2;
  static constexpr int kKVBytes = TileKV::kElems * 2;
  static constexpr int kAlignSlack = 1024;  // the dynamic base rounded up to a swizzle atom
  static constexpr int kLimit = 227 * 1024;  // opt-in shared memory per block on sm_90
  static constexpr int kMaxBarrierBytes = 8 * (2 * 2 + 4 * kStages);
  static constexpr int kFixedBytes = 2 * kStages * kKVBytes + kAlignSlack + kMaxBarrierBytes;
  // Two Q slots (the next tile's Q loads under this one) and an O tile of its own where they
  // fit; else one Q slot; else O is staged in the spent Q slot (the next Q then waits for the
  // store).
  static constexpr int kQStages = 3 * kQBytes + kFixedBytes <= kLimit ? 2 : 1;
  static constexpr bool kOAliasQ = (kQStages + 1) * kQBytes + kFixedBytes > kLimit;

  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQStages * kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKVBytes;
  static constexpr int kOffO = kOAliasQ ? kOffQ : kOffV + kStages * kKVBytes;
  static constexpr int kOffBarriers = kOAliasQ ? kOffV + kStages * kKVBytes : kOffO + kQBytes;
  static constexpr int kBarrierBytes = 8 * (2 * kQStages + 4 * kStages);
  static constexpr int kSmemBytes = kOffBarriers + kBarrierBytes + kAlignSlack;

  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");
  static_assert(kSmemBytes <= kLimit, "the tiles fit an sm_90 block's shared memory");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "1024-byte aligned tiles");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256 && kBlockM <= 256, "wgmma N, TMA boxes");
  static_assert(kConsumerRegs >= 24 && kConsumerRegs <= 256, "a setmaxnreg budget");
  static_assert(!kOAliasQ || kQStages == 1, "O staged in the one Q slot");
};

// The shared memory the forward of a head dim may ask for: the larger of its tiles'.
template <int kHeadDim>
constexpr int fwd_smem_bytes() {
  if constexpr (FwdHasLongRowTile<kHeadDim>::value) {
    constexpr int a = FwdConfig<kHeadDim, false>::kSmemBytes;
    constexpr int b = FwdConfig<kHeadDim, true>::kSmemBytes;
    return a > b ? a : b;
  } else {
    return FwdConfig<kHeadDim, false>::kSmemBytes;
  }
}

}  // namespace sm90
}  // namespace flashattn
