// Placement (docs/planner.md, step 8): maps the slots of every abstract wave to
// concrete device ids.
//
// Two placements:
//  - place_islands: island-, locality-, parameter- and memory-aware (the
//    planner's default);
//  - place_sequential: the naive one (each wave's slots on the lowest free
//    devices, in slot order), kept to measure what placement saves.
#pragma once

#include <cstdint>
#include <vector>

#include "libplan/cost/cost_model.h"
#include "libplan/rules/memory.h"
#include "libplan/waves/schedule.h"

namespace spindle::plan {

// Devices of each slot of one wave, same order as AbstractWave::slots; each
// list ascending.
struct WavePlacement {
  std::vector<std::vector<int>> slot_devices;
  bool operator==(const WavePlacement&) const = default;
};

// What placement needs to know of one MetaOp (index = MetaOp id).
struct PlaceMetaOp {
  std::vector<int> inputs;             // MetaOp ids whose last operator feeds the first
  int tensor_parallel = 1;             // K: devices of one data-parallel replica
  int64_t batch = 0;                   // samples per iteration
  // Activation leaving each operator, bytes per sample on the wire (values
  // x kWireBytesPerValue, rules/links.h): what the lowering moves.
  double out_bytes_per_sample = 0;
  // Per operator position: its parameter (index into PlaceInput::param_bytes,
  // -1 for none) and the activation bytes per sample it keeps for backward.
  std::vector<int> param;
  std::vector<double> act_bytes_per_sample;
};

struct PlaceInput {
  std::vector<PlaceMetaOp> metaops;
  // Per parameter: bytes of one tensor-parallel shard in the model dtype
  // (memory), and of its gradient on the wire (the all-reduce's payload).
  std::vector<double> param_bytes;
  std::vector<double> param_sync_bytes;
  int dtype_bytes = 2;
  int devices = 0;
  int devices_per_island = 0;          // 0: one island
  // Usable memory per device, bytes; 0: unlimited.
  double memory_bytes = 0;
  OptimizerState optimizer_state = OptimizerState::sharded;   // rules/memory.h
  const CostModel* cost = nullptr;     // links (p2p_ms, allreduce_ms); required
};

// Per device of a slot running `count` operators from `first` on `devices`
// devices: the bytes placement charges, the same model as cost_plan
// (activations at the local batch; weights and gradients in the dtype;
// fp32 master copy and AdamW m, v sharded over the slot's data-parallel
// replicas), parameters already on the device not charged again.
// `has_param(p)` says whether the device already holds parameter p.
template <class HasParam>
double slot_bytes_per_device(const PlaceInput& in, const AbstractSlot& slot, HasParam has_param);

// Places every wave in order. Per wave:
//  1. a slot on as many devices as its MetaOp's previous slice keeps those
//     devices when they are all free (its activations do not move);
//  2. slots larger than an island take whole free islands (those holding most
//     of their inputs first), the remainder like a small slot;
//  3. the other slots, larger first, each go to the island with room that
//     costs least: its input activations held outside the island cross the
//     inter-island link (forward and backward), and each of its parameters
//     already held only in other islands turns that parameter's all-reduce
//     into a cross-island one; ties go to the island holding more of its
//     inputs, then the lower index. Inside the island it takes the free
//     devices holding most of its input rows, then the least loaded memory,
//     then the lowest id. A slot that fits no single island (fragmentation)
//     takes free devices from the islands with the most room.
// Memory: a device never takes a slot that would exceed memory_bytes. When a
// wave cannot be placed, up to 4 earlier waves are placed again with devices
// chosen by free memory first; if that fails too, the wave is placed ignoring
// memory and the plan's memory check (check_plan_memory) reports the device.
// With `previous` (a placement of the same waves), each slot also counts
// where its output went there (its MetaOp's next slice, or its consumers'
// first slices) as if those bytes were inputs: a refinement pass, so that
// light first slices (embeddings) follow their heavy consumers.
// Without `previous` (the first pass), a final improvement follows over
// several islands: exchanges of two devices of one wave (between two slots,
// or a slot and an idle device), each kept when the transfers plus gradient
// synchronisation that cost_plan predicts get shorter, the transfers no
// longer, and every device stays within memory_bytes; the slots whose inputs
// or outputs cross islands are tried first, most bytes first, a slot's device
// against one device per occupant of each other island holding its inputs or
// readers, for at most 2 sweeps and 1600 / devices exchanges tried.
// Deterministic.
std::vector<WavePlacement> place_islands(const std::vector<AbstractWave>& waves, const PlaceInput& in,
                                         const std::vector<WavePlacement>* previous = nullptr);

// The bytes the improvement of place_islands counts for a placement: per
// wave, what its forward exchange delivers to each device from its island
// (intra[d]) and to each island from others (inter[i]), the same for its
// backward exchange; per device, the gradient bytes it all-reduces. A test
// holds these equal to the lowered programs' transfers and buckets
// (test_place.cpp), so the evaluator prices the messages the runtime sends,
// but for the copies of tensor-parallel parameters' whole tensors at the
// step's end (Direction::copy, lower.h: a few vectors per layer), which it
// leaves out; the simulation of the candidates it makes prices them.
struct PlacementBytes {
  struct Exchange {
    std::vector<double> intra;   // by destination device
    std::vector<double> inter;   // by destination island
  };
  std::vector<Exchange> forward, backward;   // by wave
  std::vector<double> reduced;               // by device
};
PlacementBytes placement_bytes(const std::vector<AbstractWave>& waves, const PlaceInput& in,
                               const std::vector<WavePlacement>& placed);

// The naive placement: per wave, slots in their order each take the lowest
// free devices. Requires each wave's device counts to sum to at most `devices`.
std::vector<WavePlacement> place_sequential(const std::vector<AbstractWave>& waves, int devices);

// --- implementation of the template ---

template <class HasParam>
double slot_bytes_per_device(const PlaceInput& in, const AbstractSlot& slot, HasParam has_param) {
  const PlaceMetaOp& m = in.metaops[static_cast<size_t>(slot.metaop)];
  const double replicas = param_replicas(slot.devices, m.tensor_parallel);
  double bytes = 0;
  for (int k = slot.first; k < slot.first + slot.count; ++k) {
    const auto ku = static_cast<size_t>(k);
    bytes += activation_bytes(m.act_bytes_per_sample[ku], m.batch, slot.devices);
    const int p = m.param[ku];
    if (p >= 0 && !has_param(p)) bytes += param_state_bytes(in.param_bytes[static_cast<size_t>(p)], in.dtype_bytes, replicas,
                                                            in.optimizer_state);
  }
  return bytes;
}

}  // namespace spindle::plan
