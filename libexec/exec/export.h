// Weights out: a checkpoint's parameters as a safetensors file
// (docs/spec/ops.md, "Exported weights"), the format the PyTorch and
// Hugging Face ecosystem loads.
//
// A safetensors file:
//   u64 little-endian N, the byte length of the header;
//   N bytes of JSON: {"__metadata__": {string: string}, NAME: {"dtype":
//     "F32", "shape": [dims], "data_offsets": [begin, end]}, ...}, padded
//     with spaces to a multiple of 8 bytes;
//   the data: every tensor's values, row-major, little-endian, contiguous;
//     offsets are bytes from the start of the data, tensors in ascending
//     name order with no gaps.
// Names are the checkpoint's, "M/k.r/<tensor>" (module, block index,
// repetition index, tensor; docs/spec/ops.md lists every tensor), values the
// full tensors (tensor-parallel shards reassembled), fp32 in the layout the
// runtime computes with (a weight is [in, out]: y = x W).
#pragma once

#include <map>
#include <string>

#include "libexec/tensor.h"
#include "libplan/util/status.h"

namespace spindle::exec {

// The start of the safetensors file of tensors shaped `shapes` (dtype F32,
// in the map's order) with `metadata` as "__metadata__" (omitted when
// empty): the length and the padded JSON header, which the tensors' values
// follow, in that order. Pure.
std::string safetensors_header(const std::map<std::string, Shape>& shapes,
                               const std::map<std::string, std::string>& metadata);

// What export_checkpoint wrote.
struct ExportSummary {
  std::string step_dir;  // the checkpoint read (DIR/step-N)
  int64_t step = 0;
  int64_t tensors = 0;
  int64_t elements = 0;
  int64_t bytes = 0;     // of the file written
};

// Reads the checkpoint `checkpoint` (a step directory DIR/step-N, or a
// checkpoint directory DIR, whose newest complete step is taken), verifies
// it as --resume does (load_checkpoint), and writes its parameters to
// `out_path` atomically (temporary file in the same folder, then rename),
// a tensor at a time: it holds one tensor's values, not the model's.
// Metadata: format "spindle-export" version 1, model name and sha256, step,
// seed, plan strategy and devices, layout "row-major; weights [in, out]".
// Errors: a missing, incomplete or corrupt checkpoint names the file (the
// caller's exit code 2); a failed write names `out_path` (exit code 1) and
// sets *write_failed. Nothing is written on error.
plan::Result<ExportSummary> export_checkpoint(const std::string& checkpoint, const std::string& out_path,
                                              bool* write_failed);

}  // namespace spindle::exec
