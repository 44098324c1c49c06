// NumPy .npy files, memory-mapped (docs/spec/data.md, "Dataset directory").
//
// Format (NumPy's NEP 1, versions 1.0, 2.0 and 3.0):
//   bytes 0-5   magic "\x93NUMPY"
//   bytes 6-7   major, minor version (1.0, 2.0 or 3.0)
//   then        header length: u16 little-endian (1.0) or u32 (2.0, 3.0)
//   then        the header: a Python dict literal, ASCII (UTF-8 in 3.0),
//               padded with spaces and ending in '\n', e.g.
//               {'descr': '<f4', 'fortran_order': False, 'shape': (1797, 16, 4), }
//   then        the data, C order (row-major), from the first byte after
//               the header to data_offset + numel * itemsize.
// Debian 12 packages no C++ .npy reader that maps files (xtensor's
// load_npy reads a whole file into memory), so this is a small one: the
// header parser is a pure function (fuzzed: test/fuzz/fuzz_npy.cpp), the
// data is mmap'd read-only and only the rows asked for are touched.
//
// Accepted: keys descr, fortran_order, shape in any order, each once, no
// others; descr one of the ElementType codes below, little-endian ('<'), or
// '|' for one-byte types ('=' is read as '<': the runtime is little-endian
// only); fortran_order False; shape a tuple of non-negative ints (at most 8
// dimensions, at most 2^40 elements). Rejected with a message naming the
// file: anything else (big-endian, Fortran order, object and structured
// dtypes, other types, a truncated file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "libexec/data/sample_file.h"
#include "libplan/util/status.h"

namespace spindle::exec {

struct NpyHeader {
  int major = 1, minor = 0;    // format version
  ElementType dtype = ElementType::f32;
  std::vector<int64_t> shape;  // () for a scalar
  size_t data_offset = 0;      // bytes before the data
  int64_t numel() const;       // product of shape (1 for a scalar)
};

// Parses the header at the start of `bytes` (the file's first bytes; the
// whole header must be there). Errors start with `path`. Pure, never throws.
plan::Result<NpyHeader> parse_npy_header(std::string_view bytes, const std::string& path);

// A read-only memory map of one .npy file, the SampleFile of the .npy
// format. Move-only; unmaps on destruction. Thread-safe for concurrent reads.
class NpyArray final : public SampleFile {
 public:
  // Opens, maps and checks `path`: the header (parse_npy_header) and that
  // the file holds all numel() elements. Errors name the file.
  static plan::Result<NpyArray> open(const std::string& path);

  NpyArray() = default;
  NpyArray(NpyArray&& o) noexcept;
  NpyArray& operator=(NpyArray&& o) noexcept;
  NpyArray(const NpyArray&) = delete;
  NpyArray& operator=(const NpyArray&) = delete;
  ~NpyArray();

  const std::string& path() const override { return path_; }
  const NpyHeader& header() const { return header_; }
  ElementType dtype() const override { return header_.dtype; }
  const std::vector<int64_t>& shape() const override { return header_.shape; }
  // Row r's elements (0 <= r < samples()) converted to double, appended to
  // `out` (f16 and the integer types exactly; f32 widened). Touches only
  // that row's bytes.
  void read_row(int64_t r, std::vector<double>& out) const override;

 private:
  std::string path_;
  NpyHeader header_;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// IEEE 754 half (binary16) bits -> float, exact (subnormals, inf, NaN).
float half_to_float(uint16_t h);

}  // namespace spindle::exec
