#include "libexec/data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

namespace spindle::exec {

using plan::Error;
using plan::Result;

static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

namespace {

constexpr int kMaxDims = 8;
constexpr int64_t kMaxElems = int64_t{1} << 40;
constexpr uint32_t kMaxHeaderBytes = 1u << 20;  // NumPy itself stays far below

// A cursor over the header dict text.
struct Text {
  std::string_view s;
  size_t i = 0;
  void skip_space() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool eat(char c) {
    skip_space();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool eat_word(std::string_view w) {
    skip_space();
    if (s.substr(i, w.size()) != w) return false;
    i += w.size();
    return true;
  }
  // A Python string literal in single or double quotes, no escapes.
  bool string(std::string* out) {
    skip_space();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return false;
    const char q = s[i++];
    const size_t end = s.find(q, i);
    if (end == std::string_view::npos) return false;
    *out = std::string(s.substr(i, end - i));
    if (out->find('\\') != std::string::npos) return false;
    i = end + 1;
    return true;
  }
  bool integer(int64_t* out) {
    skip_space();
    const size_t start = i;
    int64_t v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (v > (kMaxElems / 10)) return false;  // far beyond any accepted dimension
      v = v * 10 + (s[i] - '0');
      ++i;
    }
    if (i < s.size() && s[i] == 'L') ++i;  // Python 2 long suffix (format 1.0 files of old NumPy)
    *out = v;
    return i > start;
  }
};

bool parse_descr(const std::string& d, ElementType* t, std::string* why) {
  if (d.size() < 2) {
    *why = "dtype '" + d + "' is not supported";
    return false;
  }
  const char order = d[0];
  const std::string code = d.substr(1);
  struct Code {
    const char* code;
    ElementType type;
  };
  static const Code codes[] = {{"f4", ElementType::f32}, {"f2", ElementType::f16}, {"u1", ElementType::u8},
                               {"u2", ElementType::u16}, {"i4", ElementType::i32}, {"i8", ElementType::i64}};
  for (const Code& c : codes) {
    if (code != c.code) continue;
    if (order == '>' && element_size(c.type) > 1) {
      *why = "big-endian dtype '" + d + "' is not supported (save little-endian: arr.astype('<" + code + "'))";
      return false;
    }
    if (order != '<' && order != '|' && order != '=' && order != '>') break;
    *t = c.type;
    return true;
  }
  if (code == "O")
    *why = "object dtype '" + d + "' is not supported (pickled Python objects)";
  else
    *why = "dtype '" + d + "' is not supported (float32, float16, uint8, uint16, int32, int64)";
  return false;
}

}  // namespace

int64_t NpyHeader::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<NpyHeader> parse_npy_header(std::string_view bytes, const std::string& path) {
  auto bad = [&](const std::string& what) { return Error{path + ": " + what}; };
  static constexpr char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || bytes.substr(0, 6) != std::string_view(kMagic, 6))
    return bad("not a NumPy .npy file (no \\x93NUMPY magic)");
  NpyHeader h;
  h.major = static_cast<unsigned char>(bytes[6]);
  h.minor = static_cast<unsigned char>(bytes[7]);
  if (h.minor != 0 || h.major < 1 || h.major > 3)
    return bad(".npy format version " + std::to_string(h.major) + "." + std::to_string(h.minor) +
               " is not supported (1.0, 2.0, 3.0)");
  uint32_t len = 0;
  size_t start = 0;
  if (h.major == 1) {
    len = static_cast<uint32_t>(static_cast<unsigned char>(bytes[8])) |
          static_cast<uint32_t>(static_cast<unsigned char>(bytes[9])) << 8;
    start = 10;
  } else {
    if (bytes.size() < 12) return bad("truncated .npy header");
    for (int b = 0; b < 4; ++b) len |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[8 + b])) << (8 * b);
    start = 12;
  }
  if (len > kMaxHeaderBytes) return bad(".npy header of " + std::to_string(len) + " bytes is too long");
  if (bytes.size() - start < len) return bad("truncated .npy header");
  h.data_offset = start + len;
  Text t{bytes.substr(start, len)};

  bool have_descr = false, have_order = false, have_shape = false;
  if (!t.eat('{')) return bad(".npy header is not a dict");
  while (!t.eat('}')) {
    std::string key;
    if (!t.string(&key) || !t.eat(':')) return bad(".npy header: expected 'key': value");
    if (key == "descr") {
      std::string d;
      if (have_descr) return bad(".npy header: descr given twice");
      if (!t.string(&d)) return bad(".npy header: descr is not a string (structured dtypes are not supported)");
      std::string why;
      if (!parse_descr(d, &h.dtype, &why)) return bad(why);
      have_descr = true;
    } else if (key == "fortran_order") {
      if (have_order) return bad(".npy header: fortran_order given twice");
      if (t.eat_word("True")) return bad("Fortran-order arrays are not supported (save with np.ascontiguousarray)");
      if (!t.eat_word("False")) return bad(".npy header: fortran_order is not True or False");
      have_order = true;
    } else if (key == "shape") {
      if (have_shape) return bad(".npy header: shape given twice");
      if (!t.eat('(')) return bad(".npy header: shape is not a tuple");
      int64_t numel = 1;
      while (!t.eat(')')) {
        int64_t d = 0;
        if (!t.integer(&d)) return bad(".npy header: shape holds a non-integer");
        if (static_cast<int>(h.shape.size()) == kMaxDims) return bad(".npy header: more than 8 dimensions");
        if (d > 0 && numel > kMaxElems / d) return bad(".npy header: more than 2^40 elements");
        numel *= d;
        h.shape.push_back(d);
        if (!t.eat(',')) {
          if (!t.eat(')')) return bad(".npy header: shape tuple not closed");
          break;
        }
      }
      have_shape = true;
    } else {
      return bad(".npy header: unknown key '" + key + "'");
    }
    if (!t.eat(',')) {
      if (!t.eat('}')) return bad(".npy header: dict not closed");
      break;
    }
  }
  t.skip_space();
  if (t.i != t.s.size()) return bad(".npy header: bytes after the dict");
  if (!have_descr || !have_order || !have_shape)
    return bad(".npy header: needs descr, fortran_order and shape");
  return h;
}

NpyArray::NpyArray(NpyArray&& o) noexcept
    : path_(std::move(o.path_)), header_(std::move(o.header_)), map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)) {}

NpyArray& NpyArray::operator=(NpyArray&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
    path_ = std::move(o.path_);
    header_ = std::move(o.header_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
  }
  return *this;
}

NpyArray::~NpyArray() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
}

Result<NpyArray> NpyArray::open(const std::string& path) {
  // O_NONBLOCK: a FIFO in the data folder opens at once and is refused
  // below (only a regular file can be mapped); a blocking open would wait
  // for a writer forever, and every rank of the job with it. No effect on
  // a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Error{path + ": cannot open: " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{path + ": not a regular file"};
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < 10) {
    ::close(fd);
    return Error{path + ": not a NumPy .npy file (" + std::to_string(size) + " bytes)"};
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (m == MAP_FAILED) return Error{path + ": cannot map: " + std::strerror(errno)};
  NpyArray a;
  a.path_ = path;
  a.map_ = static_cast<const unsigned char*>(m);
  a.map_bytes_ = size;
  auto header = parse_npy_header(std::string_view(reinterpret_cast<const char*>(a.map_), size), path);
  if (!header.ok()) return header.error();
  a.header_ = std::move(*header);
  const uint64_t need = static_cast<uint64_t>(a.header_.numel()) * element_size(a.header_.dtype);
  if (size - a.header_.data_offset < need)
    return Error{path + ": truncated: shape (" + [&] {
      std::string s;
      for (int64_t d : a.header_.shape) s += std::to_string(d) + ",";
      return s;
    }() + ") of " + element_type_name(a.header_.dtype) + " needs " + std::to_string(need) + " data bytes, the file has " +
                 std::to_string(size - a.header_.data_offset)};
  // Rows are read in the order the sampler asks: no read-ahead of the rest.
  ::madvise(const_cast<unsigned char*>(a.map_), size, MADV_RANDOM);
  return a;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits = 0;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24, exact in float
      const float v = static_cast<float>(mant) * 0x1p-24f;
      return sign ? -v : v;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

void NpyArray::read_row(int64_t r, std::vector<double>& out) const {
  const int64_t n = row_elems();
  const size_t item = element_size(header_.dtype);
  const unsigned char* p = map_ + header_.data_offset + static_cast<size_t>(r) * static_cast<size_t>(n) * item;
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>(n));
  double* o = out.data() + base;
  auto load = [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + static_cast<size_t>(i) * sizeof(T), sizeof(T));
      o[i] = static_cast<double>(v);
    }
  };
  switch (header_.dtype) {
    case ElementType::f32: load(float{}); break;
    case ElementType::u8: load(uint8_t{}); break;
    case ElementType::u16: load(uint16_t{}); break;
    case ElementType::i32: load(int32_t{}); break;
    case ElementType::i64: load(int64_t{}); break;
    case ElementType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + static_cast<size_t>(i) * 2, 2);
        o[i] = half_to_float(v);
      }
      break;
  }
}

}  // namespace spindle::exec
