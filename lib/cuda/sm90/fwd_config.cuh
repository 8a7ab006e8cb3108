// The Hopper forward's CTA: a producer warpgroup and two consumer warpgroups of 64 query rows,
// Q once per tile, K and V through rings of kStages slots, O staged in shared memory for its
// bulk store. Tile shapes come from the kernel table (lib/cuda/generate.py); what they imply
// for shared memory is computed here, once.
#pragma once

#include "cuda/common/tile.cuh"
#include "cuda/sm90/fwd_tiles.inc"

namespace flashattn {
namespace sm90 {

template <int kHeadDim_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumers = 2;  // consumer warpgroups
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = FwdTiles<kHeadDim>::kBlockN;
  static constexpr int kStages = FwdTiles<kHeadDim>::kStages;
  static constexpr int kNThreads = 128 * (1 + kConsumers);
  // setmaxnreg budgets: (kEntryRegs - kProducerRegs) * 128 = (kConsumerRegs - kEntryRegs) * 256.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  using TileQ = common::SwizzledTile<kBlockM, kHeadDim>;  // also the O staging tile
  using TileKV = common::SwizzledTile<kBlockN, kHeadDim>;
  static constexpr int kColBlocks = TileQ::kColBlocks;  // 64-column boxes per row
  static constexpr int kQBytes = TileQ::kElems * 2;
  static constexpr int kKVBytes = TileKV::kElems * 2;
  static constexpr int kBarrierBytes = 8 * (2 + 4 * kStages);
  static constexpr int kAlignSlack = 1024;  // the dynamic base rounded up to a swizzle atom
  static constexpr int kLimit = 227 * 1024;  // opt-in shared memory per block on sm_90
  // O gets its own tile where it fits; else it is staged in the spent Q tile (then the next
  // tile's Q waits for the store).
  static constexpr bool kOAliasQ =
      2 * kQBytes + 2 * kStages * kKVBytes + kBarrierBytes + kAlignSlack > kLimit;

  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKVBytes;
  static constexpr int kOffO = kOAliasQ ? kOffQ : kOffV + kStages * kKVBytes;
  static constexpr int kOffBarriers = kOAliasQ ? kOffV + kStages * kKVBytes : kOffO + kQBytes;
  static constexpr int kSmemBytes = kOffBarriers + kBarrierBytes + kAlignSlack;

  static_assert(kSmemBytes <= kLimit, "the tiles fit an sm_90 block's shared memory");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "1024-byte aligned tiles");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "a wgmma N and a TMA box");
};

}  // namespace sm90
}  // namespace flashattn
