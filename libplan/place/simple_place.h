// Simple placement (design.md, step 8, without the memory model): maps the
// slots of every abstract wave to concrete device ids.
#pragma once

#include <vector>

#include "libplan/waves/schedule.h"

namespace spindle::plan {

// Devices of each slot of one wave, same order as AbstractWave::slots; each
// list ascending.
struct WavePlacement {
  std::vector<std::vector<int>> slot_devices;
};

// Places every wave in order. Per wave, a slot whose MetaOp's previous slice
// had the same device count first keeps those devices if they are all free
// (larger slots first, then lower MetaOp id); the other slots are taken in
// the same order and each gets the free contiguous range that,
// in order of preference: lies inside one island (or, for a slot larger than
// an island, starts at an island boundary); holds the most devices the same
// MetaOp used in its previous slice (for a first slice, the devices of the
// last slices of its inputs), so activations stay in place; starts at a
// multiple of its size; starts lowest. When fragmentation leaves no free
// range, the slot takes free devices (preferred ones first, then lowest ids).
// `metaop_inputs[m]` lists MetaOp m's inputs. Deterministic. Requires each
// wave's device counts to sum to at most `devices`.
std::vector<WavePlacement> place_simple(const std::vector<AbstractWave>& waves,
                                        const std::vector<std::vector<int>>& metaop_inputs,
                                        int devices, int devices_per_island);

// The naive placement (--placement sequential): per wave, slots in their
// order each take the lowest free devices. Deterministic.
std::vector<WavePlacement> place_sequential(const std::vector<AbstractWave>& waves, int devices);

}  // namespace spindle::plan
