// Errors as values for the planner (docs/architecture.md, convention 10).
//
// The planner never exits and never throws across its public interface: every
// function that can fail on user input returns Result<T> (or Status), whose
// error carries one human-readable message naming the file, the key path and,
// for YAML, the 1-based line and column, e.g.
//   configs/models/x.yaml:12:7: tasks[0].nodes[2].inputs: unknown input 'foo'
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace spindle::plan {

struct Error {
  std::string message;
};

// Location of a key in an input file, for error messages. line/column are
// 1-based; 0 means unknown (JSON inputs report the key path only).
struct Where {
  std::string file;
  std::string key;   // key path, e.g. "tasks[0].nodes[2].inputs"
  int line = 0;
  int column = 0;
};

// "file:line:col: key: what" (line/col omitted when unknown, key when empty).
Error make_error(const Where& where, const std::string& what);

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit on purpose
  Result(Error error) : v_(std::move(error)) {}      // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T& value() & { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  const Error& error() const { assert(!ok()); return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result without a value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status Ok() { return {}; }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { assert(!ok_); return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace spindle::plan

// Propagate an error from an expression returning Status or Result<T>.
#define SPINDLE_TRY(expr)                         \
  do {                                            \
    auto&& spindle_try_ = (expr);                 \
    if (!spindle_try_.ok()) return spindle_try_.error(); \
  } while (0)

// `SPINDLE_ASSIGN(x, expr)` declares `x` as the value of a Result-returning
// expression, or returns its error from the enclosing function.
#define SPINDLE_CONCAT_INNER_(a, b) a##b
#define SPINDLE_CONCAT_(a, b) SPINDLE_CONCAT_INNER_(a, b)
#define SPINDLE_ASSIGN(var, expr)                                          \
  auto SPINDLE_CONCAT_(var, _result_) = (expr);                            \
  if (!SPINDLE_CONCAT_(var, _result_).ok()) return SPINDLE_CONCAT_(var, _result_).error(); \
  auto var = std::move(SPINDLE_CONCAT_(var, _result_)).value()
