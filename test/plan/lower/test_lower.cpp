// Lowering (libplan/lower): one program per device. Hand-computed bytes on a
// small plan, and the invariants every lowered plan must keep, on every
// shipped workload and strategy: every message is sent by one program and
// received by another in matching exchanges, exchanges and collectives come
// in one global order (so blocking execution cannot deadlock), dependencies
// point backwards, each program runs each of its slices once forward and
// once backward, and the bytes of all programs add up.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "libplan/lower/lower.h"
#include "libplan/sim/sim.h"
#include "libplan/model/ops.h"
#include "../shipped_fixture.h"

namespace sp = spindle::plan;
namespace fs = std::filesystem;
using sp::testing::Fixture;

namespace {

// The invariants of the header, on one lowered plan; `ctx` (the graph's
// parameter ids) for the all-reduce starts' position.
// Backward pieces on each device, per producer in program order: their
// rows tile exactly the device's rows of the producer (its output gradient
// is whole), and a piece is taken as the gradient (Transfer::adds false)
// exactly when it is the producer's first there and covers all of them.
// Returns {pieces taken, pieces added}.
std::pair<int, int> check_adds(const sp::Lowered& l) {
  int taken = 0, added = 0;
  for (int d = 0; d < l.devices; ++d) {
    const sp::Program& prog = l.programs[static_cast<size_t>(d)];
    std::map<int, std::vector<const sp::Transfer*>> pieces;   // producer -> its pieces here, in order
    for (const sp::Instr& in : prog.instrs) {
      if (in.kind != sp::InstrKind::exchange || in.dir != sp::Direction::backward) continue;
      for (int t : prog.transfers_of(in)) {
        const sp::Transfer& tr = l.transfers[static_cast<size_t>(t)];
        if (tr.dst == d) pieces[tr.producer].push_back(&tr);
      }
    }
    for (const auto& [producer, got] : pieces) {
      INFO("device " << d << ", producer " << producer);
      const int ps = l.slice_of[static_cast<size_t>(producer)];
      const sp::RowRange mine = l.slices[static_cast<size_t>(ps)].layout.rows_of(l.position(ps, d));
      std::vector<int64_t> count(static_cast<size_t>(mine.size()), 0);
      for (const sp::Transfer* tr : got) {
        REQUIRE((tr->rows.begin >= mine.begin && tr->rows.end <= mine.end));
        for (int64_t r = tr->rows.begin; r < tr->rows.end; ++r) ++count[static_cast<size_t>(r - mine.begin)];
      }
      // Every row of the gradient gets at least one piece (several
      // consumers each send all of theirs).
      CHECK(std::count(count.begin(), count.end(), 0) == 0);
      for (size_t k = 0; k < got.size(); ++k) {
        const bool covers = got[k]->rows.begin == mine.begin && got[k]->rows.end == mine.end;
        CHECK(got[k]->adds == !(k == 0 && covers));
        ++(got[k]->adds ? added : taken);
      }
    }
  }
  return {taken, added};
}

// Copy sets (a parameter's shard at a TP rank above 0, over its holders)
// check_copies found stepping alike (no copies), and copied.
int copies_alike = 0, copies_made = 0;

// Whether the holders of param's shard at TP rank k mirror rank 0's:
// rank 0 has at most two holders, and each runs exactly the (slice, row
// group)s that one holder at rank k runs, a different one each.
bool mirrored(const sp::Lowered& l, const sp::LowerContext& ctx, const std::string& param, int k) {
  using Runs = std::set<std::pair<int, int>>;   // (slice, row group)
  std::map<int, Runs> at0, atk;                 // by holder
  for (size_t s = 0; s < l.slices.size(); ++s) {
    const sp::LoweredSlice& slice = l.slices[s];
    if (std::none_of(slice.ops.begin(), slice.ops.end(),
                     [&](int o) { return ctx.graph->ops[static_cast<size_t>(o)].param == param; }))
      continue;
    for (size_t i = 0; i < slice.devices.size(); ++i) {
      const int rank = slice.layout.tp_rank_of(static_cast<int>(i));
      const std::pair<int, int> run{static_cast<int>(s), slice.layout.group_of(static_cast<int>(i))};
      if (rank == 0) at0[slice.devices[i]].insert(run);
      if (rank == k) atk[slice.devices[i]].insert(run);
    }
  }
  if (at0.size() > 2 || at0.size() != atk.size()) return false;
  std::vector<Runs> a, b;
  for (auto& [d, r] : at0) a.push_back(r);
  for (auto& [d, r] : atk) b.push_back(r);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

// Whether every value of [0, whole) lies in exactly `times` (>= 1) of
// `ranges`, each within [0, whole): a sweep over the ranges' ends, so that
// a parameter of millions of values costs its ranges, not its values.
bool covered_exactly(const std::vector<sp::RowRange>& ranges, int64_t whole, int times) {
  std::vector<std::pair<int64_t, int>> ends;   // (value, +1 where a range begins, -1 where one ends)
  for (const sp::RowRange& r : ranges) {
    ends.emplace_back(r.begin, 1);
    ends.emplace_back(r.end, -1);
  }
  std::sort(ends.begin(), ends.end());
  int64_t at = 0;   // values before `at` are checked
  int depth = 0;    // how many ranges hold the values from `at` on
  for (const auto& [value, step] : ends) {
    if (value > at && depth != times) return false;   // [at, value) held `depth` times
    at = std::max(at, value);
    depth += step;
  }
  return at == whole;   // and nothing from there on is held at all
}

// The copies (Direction::copy): each takes values of TP rank 0's whole
// tensors of a parameter from a holder of that shard into a holder of the
// same parameter's shard at a TP rank above 0. Without the values'
// gathers at the next step's start every holder of such a shard gets all
// of them, once; with, each member gets its own chunk's alone, so the
// holders together get each value once. Returns the copies of part of a
// parameter's whole tensors.
int check_copies(const sp::Lowered& l, const sp::LowerContext& ctx) {
  using Key = std::tuple<std::string, int, int>;   // (param, TP rank, receiver)
  std::map<Key, std::vector<sp::RowRange>> got;
  int parts = 0;
  const bool by_chunk = l.sharded_state && l.gathers_at_start;
  auto whole_of = [&](int op) {
    return ctx.copy_values.at(static_cast<size_t>(ctx.params.of_op.at(static_cast<size_t>(op))));
  };
  std::set<std::tuple<int, int, int>> pairs;   // (src, dst, k): one transfer each
  for (const sp::Transfer& tr : l.transfers) {
    if (tr.dir != sp::Direction::copy) continue;
    REQUIRE(tr.slice > 0);
    REQUIRE((tr.input >= 0 && static_cast<size_t>(tr.input) < l.copy_runs.size()));
    const auto& run = l.copy_runs[static_cast<size_t>(tr.input)];
    REQUIRE_FALSE(run.empty());
    CHECK(tr.producer == run.front().op);
    CHECK(tr.rows.begin == 0);
    CHECK(tr.values == tr.rows.size());
    CHECK(tr.values > 0);
    CHECK(tr.wave == -1);
    CHECK(tr.bytes == (tr.src == tr.dst ? 0 : tr.values * sp::kWireBytesPerValue));
    CHECK(pairs.emplace(tr.src, tr.dst, tr.slice).second);
    int64_t covered = 0;
    std::string last_param;
    sp::for_each_copied_param(l, tr, [&](int op, int64_t begin, int64_t end, int64_t at) {
      const std::string& param = ctx.graph->ops[static_cast<size_t>(op)].param;
      INFO(param);
      CHECK(param > last_param);   // parameters in name order, each once
      last_param = param;
      const std::vector<int>& first = l.shard_devices.at({param, 0});
      const std::vector<int>& mine = l.shard_devices.at({param, tr.slice});
      CHECK(std::binary_search(first.begin(), first.end(), tr.src));
      CHECK(std::binary_search(mine.begin(), mine.end(), tr.dst));
      CHECK(at == covered);
      REQUIRE((0 <= begin && begin < end && end <= whole_of(op)));
      if (!by_chunk) CHECK((begin == 0 && end == whole_of(op)));
      covered += end - begin;
      parts += end - begin < whole_of(op);
      got[{param, tr.slice, tr.dst}].push_back({begin, end});
    });
    CHECK(covered == tr.values);
  }
  size_t keys = 0;
  for (const auto& [key, holders] : l.shard_devices) {
    const auto id = std::find(ctx.params.names.begin(), ctx.params.names.end(), key.first) - ctx.params.names.begin();
    const int64_t whole = ctx.copy_values.at(static_cast<size_t>(id));
    if (key.second == 0 || whole == 0) continue;
    INFO(key.first << "@" << key.second);
    // Copies that step alike get none: at most two holders at rank 0, and
    // each runs exactly the (slice, row group)s one holder at this rank runs.
    if (mirrored(l, ctx, key.first, key.second)) {
      ++copies_alike;
      for (int d : holders) CHECK_FALSE(got.contains({key.first, key.second, d}));
      continue;
    }
    ++copies_made;
    std::vector<sp::RowRange> all;
    for (int d : holders) {
      std::vector<sp::RowRange> own;
      if (const auto it = got.find({key.first, key.second, d}); it != got.end()) {
        ++keys;
        own = it->second;
        for (const sp::RowRange& r : own) REQUIRE((r.begin >= 0 && r.end <= whole));
      }
      if (!by_chunk) CHECK(covered_exactly(own, whole, 1));
      all.insert(all.end(), own.begin(), own.end());
    }
    CHECK(covered_exactly(all, whole, by_chunk ? 1 : static_cast<int>(holders.size())));
  }
  CHECK(keys == got.size());   // every receiver holds the shard it gets
  return parts;
}

void check_invariants(const sp::Plan& plan, const sp::Lowered& l, const sp::LowerContext& ctx) {
  REQUIRE(static_cast<int>(l.programs.size()) == plan.devices);
  // Global order of exchanges: (direction, wave) pairs; each program visits
  // its own in the same relative order.
  auto exchange_rank = [&](const sp::Instr& in) {
    const int waves = static_cast<int>(plan.waves.size());
    return in.dir == sp::Direction::forward ? in.wave : 2 * waves - 1 - in.wave;
  };
  std::map<int, int> sent_by, received_by;  // transfer -> device whose program has it
  sp::ProgramBytes sum;
  std::map<int, int> reduced_by;   // bucket -> members whose program reduces it
  std::map<int, int> gathered_by;  // bucket -> members whose program all-gathers it (sharded state)
  int64_t norm_values = 0;         // the norm_sums' values, over every device
  for (const sp::Program& prog : l.programs) {
    int last_exchange = -1, last_bucket = -1, last_started = -1, last_waited = -1, last_gathered = -1;
    int last_backward = -1;   // slice of the latest backward
    bool optimizer = false, blocking = false, overlapped = false;
    int norm = -1;   // the grad_norm instruction (Lowered::grad_norm)
    std::set<int> started, stepped, waited;
    std::vector<int> gathers, gathers_waited;   // allgather_start's, allgather_wait's buckets in order
    std::multiset<int> fwd, bwd;
    std::set<int> posted_recvs;   // transfers whose receive a post_recv posted, not yet in an exchange
    bool early = false;           // a post_send or post_recv seen
    // With deps lowered (LowerOptions::deps, the default), one list per
    // instruction; without, none.
    CHECK((prog.deps.empty() || prog.deps.size() == prog.instrs.size()));
    const std::vector<int> no_deps;
    auto deps_of = [&](size_t i) -> const std::vector<int>& { return prog.deps.empty() ? no_deps : prog.deps.at(i); };
    for (size_t i = 0; i < prog.instrs.size(); ++i) {
      const sp::Instr& in = prog.instrs[i];
      const std::vector<int>& in_deps = deps_of(i);
      for (int d : in_deps) CHECK((d >= 0 && d < static_cast<int>(i)));
      // The rest's optimizer step is last but for that (and, without
      // overlap, the all-gathers of sharded state).
      CHECK((!optimizer || in.kind == sp::InstrKind::wait_sends ||
             (in.kind == sp::InstrKind::allgather && !overlapped) ||
             (in.kind == sp::InstrKind::exchange && in.dir == sp::Direction::copy)));
      switch (in.kind) {
        case sp::InstrKind::exchange:
          if (in.dir == sp::Direction::copy) {   // the copies: once, after every optimizer step and all-gather
            CHECK(optimizer);
            CHECK(in.wave == -1);
            CHECK((i + 1 == prog.instrs.size() ||
                   (i + 2 == prog.instrs.size() && prog.instrs[i + 1].kind == sp::InstrKind::wait_sends)));
            CHECK(prog.transfers_of(in).size() > 0);
            for (int t : prog.transfers_of(in)) {
              const sp::Transfer& tr = l.transfers[static_cast<size_t>(t)];
              CHECK(tr.dir == sp::Direction::copy);
              CHECK((tr.src == prog.device || tr.dst == prog.device));
              if (tr.src == prog.device && tr.dst != prog.device) CHECK(sent_by.emplace(t, prog.device).second);
              if (tr.dst == prog.device && tr.src != prog.device) CHECK(received_by.emplace(t, prog.device).second);
            }
            break;
          }
          CHECK(exchange_rank(in) > last_exchange);
          last_exchange = exchange_rank(in);
          CHECK(last_bucket < 0);
          CHECK(last_waited < 0);   // a started all-reduce is waited for after every exchange
          for (int t : prog.transfers_of(in)) {
            const sp::Transfer& tr = l.transfers[static_cast<size_t>(t)];
            CHECK(tr.dir == in.dir);
            CHECK(tr.wave == in.wave);
            CHECK((tr.src == prog.device || tr.dst == prog.device));
            if (tr.src == prog.device && tr.dst != prog.device) {
              CHECK_FALSE(early);   // posted early: in a post_send, not here
              CHECK(sent_by.emplace(t, prog.device).second);
            }
            if (tr.dst == prog.device && tr.src != prog.device) {
              CHECK(received_by.emplace(t, prog.device).second);
              if (early) CHECK(posted_recvs.erase(t) == 1);   // posted by an earlier post_recv
            }
          }
          break;
        case sp::InstrKind::post_send: {
          early = true;
          // Right after the compute that made the rows: the producer's
          // forward, or the consumer's backward (its input gradient); and
          // before the exchange that would have sent them.
          REQUIRE(i > 0);
          const sp::Instr& before = prog.instrs[i - 1];
          CHECK(in_deps == std::vector<int>{static_cast<int>(i) - 1});
          CHECK(before.slice == in.slice);
          CHECK(before.kind == (in.dir == sp::Direction::forward ? sp::InstrKind::forward : sp::InstrKind::backward));
          CHECK(prog.transfers_of(in).size() > 0);
          for (int t : prog.transfers_of(in)) {
            const sp::Transfer& tr = l.transfers[static_cast<size_t>(t)];
            CHECK(tr.dir == in.dir);
            CHECK(tr.src == prog.device);
            CHECK(tr.dst != prog.device);
            CHECK((in.dir == sp::Direction::forward ? l.slice_of[static_cast<size_t>(tr.producer)] : tr.slice) == in.slice);
            sp::Instr at;
            at.dir = tr.dir;
            at.wave = tr.wave;
            CHECK(exchange_rank(at) > last_exchange);
            CHECK(sent_by.emplace(t, prog.device).second);
          }
          break;
        }
        case sp::InstrKind::post_recv: {
          early = true;
          CHECK(posted_recvs.empty());   // one exchange ahead: the one before has taken its receives
          CHECK(prog.transfers_of(in).size() > 0);
          for (int t : prog.transfers_of(in)) {
            const sp::Transfer& tr = l.transfers[static_cast<size_t>(t)];
            CHECK(tr.dst == prog.device);
            CHECK(tr.src != prog.device);
            CHECK(tr.dir == in.dir);
            CHECK(tr.wave == in.wave);
            posted_recvs.insert(t);
          }
          break;
        }
        case sp::InstrKind::forward: fwd.insert(in.slice); break;
        case sp::InstrKind::backward:
          bwd.insert(in.slice);
          CHECK(fwd.count(in.slice) == 1);
          last_backward = in.slice;
          break;
        case sp::InstrKind::allreduce:
          CHECK(norm < 0);   // every all-reduce before the norm
          blocking = true;
          CHECK(in.bucket > last_bucket);
          last_bucket = in.bucket;
          CHECK(std::binary_search(l.buckets[static_cast<size_t>(in.bucket)].devices.begin(),
                                   l.buckets[static_cast<size_t>(in.bucket)].devices.end(), prog.device));
          ++reduced_by[in.bucket];
          break;
        case sp::InstrKind::allreduce_start: {
          overlapped = true;
          const sp::Bucket& b = l.buckets[static_cast<size_t>(in.bucket)];
          auto uses = [&](size_t sl) {   // slice sl has one of the bucket's parameters
            for (int o : l.slices[sl].ops)
              if (std::find(b.params.begin(), b.params.end(), ctx.params.of_op[static_cast<size_t>(o)]) != b.params.end())
                return true;
            return false;
          };
          if (plan.bucket_starts == sp::BucketStarts::in_order) {
            CHECK(in.bucket > last_started);   // started in the one global order
          } else {
            // Started as soon as ready: the latest backward made its last
            // gradient here, and each bucket starts once.
            REQUIRE(last_backward >= 0);
            CHECK(uses(static_cast<size_t>(last_backward)));
            CHECK(started.count(in.bucket) == 0);
          }
          last_started = std::max(last_started, in.bucket);
          started.insert(in.bucket);
          CHECK(std::binary_search(b.devices.begin(), b.devices.end(), prog.device));
          // Every backward of this device using one of its parameters ran.
          for (size_t sl = 0; sl < l.slices.size(); ++sl)
            if (l.position(static_cast<int>(sl), prog.device) >= 0 && uses(sl)) CHECK(bwd.count(static_cast<int>(sl)) == 1);
          ++reduced_by[in.bucket];
          break;
        }
        case sp::InstrKind::allreduce_wait:
          CHECK(norm < 0);
          overlapped = true;
          CHECK(in.bucket > last_waited);   // waited for in the one global order, whatever the starts
          last_waited = in.bucket;
          CHECK(started.count(in.bucket) == 1);
          waited.insert(in.bucket);
          break;
        case sp::InstrKind::optimizer:
          // With the norm, every step after it, and depending on it.
          CHECK(l.grad_norm == (norm >= 0));
          if (norm >= 0 && !in_deps.empty()) CHECK(std::count(in_deps.begin(), in_deps.end(), norm) == 1);
          if (in.bucket >= 0) {   // a bucket's shards, right after its wait (or in wait order after the norm)
            CHECK(overlapped);
            if (norm < 0) {
              CHECK(in.bucket == last_waited);
              CHECK(prog.instrs[i - 1].kind == sp::InstrKind::allreduce_wait);
            } else {
              CHECK((stepped.empty() || in.bucket > *stepped.rbegin()));
              CHECK(waited.count(in.bucket) == 1);
            }
            CHECK(stepped.insert(in.bucket).second);
          } else {
            CHECK_FALSE(optimizer);
            optimizer = true;
            // The rest, last but for the wait for the sends posted early
            // (and, blocking, the all-gathers of sharded state).
            size_t after = i + 1;
            CHECK(gathers_waited.size() == gathers.size());   // every gather waited for before
            while (after < prog.instrs.size() && prog.instrs[after].kind == sp::InstrKind::allgather) ++after;
            if (after < prog.instrs.size() && prog.instrs[after].kind == sp::InstrKind::exchange &&
                prog.instrs[after].dir == sp::Direction::copy)
              ++after;
            CHECK((after == prog.instrs.size() ||
                   (after + 1 == prog.instrs.size() && prog.instrs[after].kind == sp::InstrKind::wait_sends)));
          }
          break;
        case sp::InstrKind::allgather:
          // Sharded state only: right after the bucket's optimizer step
          // (overlap), or after the one step of all (blocking); buckets in
          // the one global order, each once.
          CHECK(l.sharded_state);
          CHECK(in.bucket > last_gathered);
          last_gathered = in.bucket;
          CHECK((plan.param_gather == sp::ParamGather::after_step || !overlapped));
          CHECK_FALSE(l.gathers_at_start);
          if (overlapped) {
            CHECK(prog.instrs[i - 1].kind == sp::InstrKind::optimizer);
            CHECK(prog.instrs[i - 1].bucket == in.bucket);
          } else {
            CHECK(optimizer);
          }
          if (!in_deps.empty()) CHECK(in_deps == std::vector<int>{static_cast<int>(i) - 1});
          ++gathered_by[in.bucket];
          break;
        case sp::InstrKind::allgather_start: {
          // Overlapped sharded state, gathered at the next step's start
          // only: first in the program, in the gather order (first wave,
          // then index), each of its buckets once.
          CHECK(l.sharded_state);
          CHECK(plan.param_gather == sp::ParamGather::next_step);
          CHECK(l.gathers_at_start);
          CHECK(i == gathers.size());
          const sp::Bucket& b = l.buckets[static_cast<size_t>(in.bucket)];
          CHECK(std::binary_search(b.devices.begin(), b.devices.end(), prog.device));
          if (!gathers.empty()) {
            const sp::Bucket& a = l.buckets[static_cast<size_t>(gathers.back())];
            CHECK((std::pair{a.first_wave, gathers.back()} < std::pair{b.first_wave, in.bucket}));
          }
          gathers.push_back(in.bucket);
          CHECK(in_deps.empty());
          ++gathered_by[in.bucket];
          break;
        }
        case sp::InstrKind::allgather_wait: {
          // In the order started; before every forward using one of the
          // bucket's parameters, and no earlier than needed: the next
          // instruction but other waits is a forward using a parameter of
          // this bucket or of one gathered after it.
          REQUIRE(gathers_waited.size() < gathers.size());
          CHECK(in.bucket == gathers[gathers_waited.size()]);
          gathers_waited.push_back(in.bucket);
          if (!in_deps.empty()) CHECK(in_deps == std::vector<int>{static_cast<int>(gathers_waited.size()) - 1});
          auto uses = [&](int slice, int bucket) {
            const sp::Bucket& b = l.buckets[static_cast<size_t>(bucket)];
            for (int o : l.slices[static_cast<size_t>(slice)].ops)
              if (std::find(b.params.begin(), b.params.end(), ctx.params.of_op[static_cast<size_t>(o)]) != b.params.end())
                return true;
            return false;
          };
          for (int sl : fwd) CHECK_FALSE(uses(sl, in.bucket));
          size_t next = i + 1;
          while (next < prog.instrs.size() && prog.instrs[next].kind == sp::InstrKind::allgather_wait) ++next;
          REQUIRE(next < prog.instrs.size());
          const sp::Instr& user = prog.instrs[next];
          CHECK(user.kind == sp::InstrKind::forward);
          bool needed = false;
          for (size_t g = gathers_waited.size() - 1; g < gathers.size(); ++g) needed |= uses(user.slice, gathers[g]);
          CHECK(needed);
          if (!deps_of(next).empty()) CHECK(std::count(deps_of(next).begin(), deps_of(next).end(), static_cast<int>(i)) == 1);
          break;
        }
        case sp::InstrKind::norm_sum: {
          // Once, after every all-reduce of the device's buckets (and,
          // with deps, depending on each and on every backward), right
          // before the grad_norm, reading the values the device counts.
          CHECK(l.grad_norm);
          CHECK(norm < 0);
          CHECK(stepped.empty());
          CHECK_FALSE(optimizer);
          CHECK(waited == started);
          CHECK(in.values == l.norm_values(prog.device, ctx));
          norm_values += in.values;
          REQUIRE(i + 1 < prog.instrs.size());
          CHECK(prog.instrs[i + 1].kind == sp::InstrKind::grad_norm);
          if (!prog.deps.empty())
            for (size_t j = 0; j < i; ++j) {
              const sp::InstrKind k = prog.instrs[j].kind;
              const bool needed = k == sp::InstrKind::allreduce || k == sp::InstrKind::allreduce_wait ||
                                  k == sp::InstrKind::backward;
              if (needed) CHECK(std::count(in_deps.begin(), in_deps.end(), static_cast<int>(j)) == 1);
            }
          break;
        }
        case sp::InstrKind::grad_norm: {
          // Once, right after its norm_sum (depending on it), before any
          // optimizer step.
          CHECK(l.grad_norm);
          CHECK(norm < 0);
          norm = static_cast<int>(i);
          REQUIRE(i > 0);
          CHECK(prog.instrs[i - 1].kind == sp::InstrKind::norm_sum);
          if (!prog.deps.empty()) CHECK(in_deps == std::vector<int>{static_cast<int>(i) - 1});
          break;
        }
        case sp::InstrKind::wait_sends: {
          // Last, after every post_send, waiting for each of them.
          CHECK(i + 1 == prog.instrs.size());
          std::vector<int> sends;
          for (size_t j = 0; j < i; ++j)
            if (prog.instrs[j].kind == sp::InstrKind::post_send) sends.push_back(static_cast<int>(j));
          CHECK_FALSE(sends.empty());
          if (!in_deps.empty()) CHECK(in_deps == sends);
          break;
        }
      }
    }
    CHECK(optimizer);
    CHECK(l.grad_norm == (norm >= 0));
    CHECK(posted_recvs.empty());   // every receive posted early is waited for by its exchange
    const bool sends_posted = std::any_of(prog.instrs.begin(), prog.instrs.end(),
                                          [](const sp::Instr& x) { return x.kind == sp::InstrKind::post_send; });
    CHECK(sends_posted == (prog.instrs.back().kind == sp::InstrKind::wait_sends));
    CHECK_FALSE((early && blocking));  // early transfers come with overlap only
    if (overlapped) CHECK(stepped == started);   // every bucket's shards stepped after its wait
    CHECK_FALSE((blocking && overlapped));
    CHECK(waited == started);   // every started one waited for
    CHECK(gathers_waited == gathers);
    // Sharded state: a bucket's values gathered once per step, overlapped iff
    // its gradients are.
    if (l.sharded_state && (overlapped || blocking)) {
      std::vector<int> mine;
      for (size_t k = 0; k < l.buckets.size(); ++k)
        if (std::binary_search(l.buckets[k].devices.begin(), l.buckets[k].devices.end(), prog.device))
          mine.push_back(static_cast<int>(k));
      std::vector<int> got = gathers;
      std::sort(got.begin(), got.end());
      CHECK(got == (overlapped && plan.param_gather == sp::ParamGather::next_step ? mine : std::vector<int>{}));
    }
    CHECK(fwd == bwd);
    for (size_t s = 0; s < l.slices.size(); ++s)
      CHECK(static_cast<int>(fwd.count(static_cast<int>(s))) == (l.position(static_cast<int>(s), prog.device) >= 0 ? 1 : 0));
    const sp::ProgramBytes b = l.bytes(prog.device);
    sum.sent += b.sent;
    sum.received += b.received;
    int64_t gathered = 0;
    for (size_t k = 0; k < l.buckets.size(); ++k)
      if (std::binary_search(l.buckets[k].devices.begin(), l.buckets[k].devices.end(), prog.device))
        gathered += l.gather_bytes(static_cast<int>(k));
    CHECK(b.gathered == gathered);
  }
  // Every message between two devices is in both programs, once.
  for (size_t t = 0; t < l.transfers.size(); ++t) {
    const sp::Transfer& tr = l.transfers[t];
    if (tr.src == tr.dst) {
      CHECK(tr.bytes == 0);
      continue;
    }
    CHECK(sent_by.at(static_cast<int>(t)) == tr.src);
    CHECK(received_by.at(static_cast<int>(t)) == tr.dst);
    CHECK(tr.bytes == tr.values * sp::kWireBytesPerValue);
  }
  CHECK(sum.sent == sum.received);
  check_copies(l, ctx);
  // Each device's optimizer steps step every parameter shard it holds, once
  // (from the holders' map, not the buckets): what CostModel::optimizer_ms
  // prices.
  // With sharded state (ZeRO-1) each of a bucket's values is stepped on
  // one member alone: the members' chunks cover the bucket once.
  std::vector<int64_t> held(static_cast<size_t>(plan.devices), 0), stepped(held.size(), 0);
  for (const auto& [key, devices] : l.shard_devices)
    for (int d : devices) held[static_cast<size_t>(d)] += ctx.shard_values[static_cast<size_t>(l.param_op.at(key.first))];
  for (size_t k = 0; l.sharded_state && k < l.buckets.size(); ++k) {
    const sp::Bucket& b = l.buckets[k];
    int64_t covered = 0, end = 0;
    for (int d : b.devices) {
      const sp::ValueRange own = l.owned(static_cast<int>(k), d);
      CHECK(own.begin == end);   // chunks in device order, no gap
      end = own.end;
      covered += own.size();
      held[static_cast<size_t>(d)] -= b.values - own.size();
    }
    CHECK(covered == b.values);
    CHECK(l.gather_bytes(static_cast<int>(k)) ==
          static_cast<int64_t>(b.devices.size()) * sp::owned_chunk(b.values, static_cast<int>(b.devices.size())) *
              sp::kWireBytesPerValue);
  }
  for (const sp::Program& prog : l.programs)
    for (const sp::Instr& in : prog.instrs)
      if (in.kind == sp::InstrKind::optimizer) stepped[static_cast<size_t>(prog.device)] += in.values;
  CHECK(stepped == held);
  // The gradient norm counts every parameter value of the model once over
  // all devices (its full tensors, as one device holds them): of each
  // shard its first holder (with sharded state, every holder its own
  // chunk: the chunks cover each bucket once, above), and of a tensor whole
  // on every TP rank only rank 0's copy.
  int64_t model_total = 0, norm_total = 0;
  for (const auto& [name, op_index] : l.param_op) {
    const sp::Operator& op = ctx.graph->ops[static_cast<size_t>(op_index)];
    const sp::Task& task = ctx.model->tasks[static_cast<size_t>(op.task)];
    const sp::Module* module = ctx.model->find_module(task.nodes[static_cast<size_t>(op.node)].module);
    REQUIRE(module != nullptr);
    model_total += sp::op_param_count(op.workload.op, op.workload.dims, module->max_seq);
  }
  for (const auto& [key, devices] : l.shard_devices) {
    int counters = 0;
    for (int d : devices) counters += l.counts_in_norm(key, d) ? 1 : 0;
    CHECK(counters == (l.sharded_state ? static_cast<int>(devices.size()) : 1));
    CHECK(l.counts_in_norm(key, devices.front()));
  }
  for (int d = 0; d < plan.devices; ++d) norm_total += l.norm_values(d, ctx);
  CHECK(norm_total == model_total);
  if (l.grad_norm) CHECK(norm_values == model_total);   // the programs' norm_sums
  for (size_t k = 0; k < l.buckets.size(); ++k) {
    const sp::Bucket& b = l.buckets[k];
    CHECK(reduced_by[static_cast<int>(k)] == static_cast<int>(b.devices.size()));   // by every member, once
    CHECK(gathered_by[static_cast<int>(k)] == (l.sharded_state ? static_cast<int>(b.devices.size()) : 0));
    CHECK(b.devices.size() >= 2);
    CHECK(b.bytes == b.values * sp::kWireBytesPerValue);
    CHECK(b.values > 0);
  }
}

}  // namespace

TEST_CASE("covered_exactly (the copies' check): the same answer as counting each value") {
  CHECK(covered_exactly({{0, 4}}, 4, 1));
  CHECK(covered_exactly({{2, 4}, {0, 2}}, 4, 1));
  CHECK_FALSE(covered_exactly({{0, 2}, {3, 4}}, 4, 1));   // 2 is missing
  CHECK_FALSE(covered_exactly({{0, 3}, {2, 4}}, 4, 1));   // 2 twice
  CHECK_FALSE(covered_exactly({{0, 3}}, 4, 1));           // the tail
  CHECK_FALSE(covered_exactly({{1, 4}}, 4, 1));           // the head
  CHECK_FALSE(covered_exactly({}, 4, 1));
  CHECK(covered_exactly({{0, 4}, {0, 1}, {1, 4}}, 4, 2));
  CHECK_FALSE(covered_exactly({{0, 4}, {0, 1}, {2, 4}}, 4, 2));
  // Random ranges against a count of every value.
  std::mt19937 rng(7);
  int agreed = 0, held = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t whole = 1 + static_cast<int64_t>(rng() % 12);
    const int times = 1 + static_cast<int>(rng() % 3);
    std::vector<sp::RowRange> ranges(rng() % 6);
    std::vector<int> count(static_cast<size_t>(whole), 0);
    for (sp::RowRange& r : ranges) {
      r.begin = static_cast<int64_t>(rng() % static_cast<uint32_t>(whole));
      r.end = r.begin + 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(whole - r.begin));
      for (int64_t v = r.begin; v < r.end; ++v) ++count[static_cast<size_t>(v)];
    }
    const bool counted = std::count(count.begin(), count.end(), times) == whole;
    agreed += covered_exactly(ranges, whole, times) == counted;
    held += counted;
  }
  CHECK(agreed == 2000);
  CHECK(held >= 20);   // both answers drawn often enough to compare (38 of the 2000 hold)
}

TEST_CASE("lowering by hand: tiny-clip on 2 devices, sequential strategy") {
  // Sequential: every MetaOp on both devices, so each activation stays where
  // it is (local copies only) and every parameter is all-reduced over {0, 1}.
  Fixture f("tiny-clip", "cpu-1x2");
  sp::Plan plan = f.plan(sp::Strategy::sequential);
  plan.optimizer_state = sp::OptimizerState::sharded;   // ZeRO-1 (auto keeps it replicated on these devices)
  const auto ctx = sp::lower_context(f.model, f.graph);
  REQUIRE(ctx.ok());
  sp::LowerOptions blocking;
  blocking.sync = sp::GradSync{};
  blocking.sync->overlap = false;
  auto lowered = sp::lower(plan, f.model, f.graph, blocking);
  REQUIRE(lowered.ok());
  check_invariants(plan, *lowered, *ctx);
  for (const sp::Transfer& t : lowered->transfers) CHECK(t.src == t.dst);
  REQUIRE(lowered->buckets.size() == 1);
  CHECK(lowered->buckets[0].devices == std::vector<int>{0, 1});
  // Every parameter of the model, whole (no tensor parallelism): the sum of
  // the catalogue's counts over the distinct parameters.
  int64_t values = 0;
  std::set<std::string> seen;
  for (const sp::Operator& op : f.graph.ops) {
    if (!seen.insert(op.param).second) continue;
    const sp::Task& task = f.model.tasks[static_cast<size_t>(op.task)];
    values += sp::op_param_count(op.workload.op, op.workload.dims,
                                 f.model.find_module(task.nodes[static_cast<size_t>(op.node)].module)->max_seq);
  }
  CHECK(lowered->buckets[0].values == values);
  // The optimizer state sharded (ZeRO-1): device 0
  // steps the first ceil(values / 2) values, device 1 the rest, and the
  // all-gather leaves 2 x ceil(values / 2) values on each.
  const int64_t half = (values + 1) / 2;
  CHECK(lowered->owned(0, 0).begin == 0);
  CHECK(lowered->owned(0, 0).end == half);
  CHECK(lowered->owned(0, 1).begin == half);
  CHECK(lowered->owned(0, 1).end == values);
  for (int d = 0; d < 2; ++d) CHECK(lowered->bytes(d) == sp::ProgramBytes{0, 0, values * 4, 2 * half * 4});
  // The program of device 0 starts with the forward of the first wave's slice
  // and ends with the bucket, the optimizer (its chunk) and the all-gather.
  const sp::Program& p0 = lowered->programs[0];
  CHECK(p0.instrs.front().kind == sp::InstrKind::forward);
  CHECK(p0.instrs[p0.instrs.size() - 3].kind == sp::InstrKind::allreduce);
  CHECK(p0.instrs[p0.instrs.size() - 2].kind == sp::InstrKind::optimizer);
  CHECK(p0.instrs[p0.instrs.size() - 2].values == half);
  CHECK(p0.instrs.back().kind == sp::InstrKind::allgather);
  CHECK(lowered->programs[1].instrs[lowered->programs[1].instrs.size() - 2].values == values - half);
  // Replicated: no all-gather, every value stepped on both.
  sp::Plan whole = plan;
  whole.optimizer_state = sp::OptimizerState::replicated;
  auto replicated = sp::lower(whole, f.model, f.graph, blocking);
  REQUIRE(replicated.ok());
  check_invariants(whole, *replicated, *ctx);
  CHECK(replicated->programs[0].instrs.back().kind == sp::InstrKind::optimizer);
  CHECK(replicated->programs[0].instrs.back().values == values);
  for (int d = 0; d < 2; ++d) CHECK(replicated->bytes(d) == sp::ProgramBytes{0, 0, values * 4, 0});
  // Overlapped: the bucket holds a parameter of the first wave's MetaOp, so
  // it starts right after that MetaOp's backward, the last one, and is
  // waited for just before the optimizer, after the last exchange.
  auto overlapped = sp::lower(plan, f.model, f.graph);
  REQUIRE(overlapped.ok());
  check_invariants(plan, *overlapped, *ctx);
  const sp::Program& q0 = overlapped->programs[0];
  size_t last_bwd = 0, start = 0;
  for (size_t i = 0; i < q0.instrs.size(); ++i) {
    if (q0.instrs[i].kind == sp::InstrKind::backward) last_bwd = i;
    if (q0.instrs[i].kind == sp::InstrKind::allreduce_start) start = i;
  }
  CHECK(start == last_bwd + 1);
  // The wait, the optimizer step of the bucket's shards (this device's
  // chunk), its all-gather, and the step of the rest (Plan::param_gather
  // after_step, the default).
  CHECK(q0.instrs[q0.instrs.size() - 4].kind == sp::InstrKind::allreduce_wait);
  CHECK(q0.instrs[q0.instrs.size() - 3].kind == sp::InstrKind::optimizer);
  CHECK(q0.instrs[q0.instrs.size() - 3].bucket == 0);
  CHECK(q0.instrs[q0.instrs.size() - 2].kind == sp::InstrKind::allgather);
  CHECK(q0.instrs.back().bucket == -1);
  CHECK(q0.instrs.size() == p0.instrs.size() + 2);
  // Gathered at the next step's start instead (next_step): the step ends
  // with the wait and the two optimizer steps; the values' all-gather is
  // the program's first instruction and is waited for right before the
  // first forward, which uses the bucket. The same bytes.
  sp::Plan next = plan;
  next.param_gather = sp::ParamGather::next_step;
  auto at_start = sp::lower(next, f.model, f.graph);
  REQUIRE(at_start.ok());
  check_invariants(next, *at_start, *ctx);
  const sp::Program& r0 = at_start->programs[0];
  CHECK(r0.instrs[r0.instrs.size() - 3].kind == sp::InstrKind::allreduce_wait);
  CHECK(r0.instrs[r0.instrs.size() - 2].kind == sp::InstrKind::optimizer);
  CHECK(r0.instrs[r0.instrs.size() - 2].bucket == 0);
  CHECK(r0.instrs[r0.instrs.size() - 2].values == half);
  CHECK(r0.instrs.back().bucket == -1);
  CHECK(r0.instrs[0].kind == sp::InstrKind::allgather_start);
  CHECK(r0.instrs[0].bucket == 0);
  CHECK(r0.instrs[1].kind == sp::InstrKind::allgather_wait);
  CHECK(r0.instrs[2].kind == sp::InstrKind::forward);
  CHECK(std::count(r0.deps.at(2).begin(), r0.deps.at(2).end(), 1) == 1);
  CHECK(std::none_of(r0.instrs.begin(), r0.instrs.end(),
                     [](const sp::Instr& in) { return in.kind == sp::InstrKind::allgather; }));
  CHECK(r0.instrs.size() == q0.instrs.size() + 1);
  for (int d = 0; d < 2; ++d) CHECK(at_start->bytes(d) == sp::ProgramBytes{0, 0, values * 4, 2 * half * 4});
  // Without overlap the plan's choice changes nothing: blocking, after the step.
  auto next_blocking = sp::lower(next, f.model, f.graph, blocking);
  REQUIRE(next_blocking.ok());
  CHECK(sp::program_json(*next_blocking, f.graph, 0) == sp::program_json(*lowered, f.graph, 0));
}

TEST_CASE("gradient buckets are cut at the size cap, in the order their gradients become final") {
  // tiny-clip's sequential plan on 2 devices: every parameter in one bucket
  // over {0, 1} (92096 bytes). Cut at 30000 bytes: pieces of at most that
  // (a larger shard alone), every shard once, latest first wave first.
  Fixture f("tiny-clip", "cpu-1x2");
  const sp::Plan plan = f.plan(sp::Strategy::sequential);
  const auto ctx = sp::lower_context(f.model, f.graph);
  REQUIRE(ctx.ok());
  auto whole = sp::lower(plan, f.model, f.graph);
  REQUIRE(whole.ok());
  REQUIRE(whole->buckets.size() == 1);
  sp::LowerOptions cut;
  cut.sync = sp::GradSync{};
  cut.sync->bucket_bytes = 30000;
  auto pieces = sp::lower(plan, f.model, f.graph, cut);
  REQUIRE(pieces.ok());
  check_invariants(plan, *pieces, *ctx);
  REQUIRE(pieces->buckets.size() >= 4);
  std::multiset<sp::ShardKey> shards;
  int64_t values = 0;
  for (size_t k = 0; k < pieces->buckets.size(); ++k) {
    const sp::Bucket& b = pieces->buckets[k];
    CHECK(b.devices == std::vector<int>{0, 1});
    CHECK((b.bytes <= 30000 || b.shards.size() == 1));
    if (k > 0) CHECK(b.first_wave <= pieces->buckets[k - 1].first_wave);
    shards.insert(b.shards.begin(), b.shards.end());
    values += b.values;
  }
  CHECK(values == whole->buckets[0].values);
  CHECK(shards == std::multiset<sp::ShardKey>(whole->buckets[0].shards.begin(), whole->buckets[0].shards.end()));
  CHECK(pieces->bytes(0) == whole->bytes(0));
  // The first piece (the last waves' parameters) starts before the last
  // backward: it overlaps the rest of the backward pass.
  const sp::Program& p0 = pieces->programs[0];
  size_t first_start = 0, last_bwd = 0;
  for (size_t i = p0.instrs.size(); i-- > 0;) {
    if (p0.instrs[i].kind == sp::InstrKind::allreduce_start) first_start = i;
    if (p0.instrs[i].kind == sp::InstrKind::backward && last_bwd == 0) last_bwd = i;
  }
  CHECK(first_start < last_bwd);
  CHECK(sp::bucket_bytes_of_mb(25) == int64_t{25} << 20);
  CHECK(sp::bucket_bytes_of_mb(-1) >= 1);
}

TEST_CASE("lowering by hand: a transfer between two one-device slices") {
  // tiny-clip on 2 devices with hand-made waves: every MetaOp of the first
  // level on device 0, every later one on device 1. The loss's inputs cross:
  // each embedding of batch B x dim values, forward and backward.
  Fixture f("tiny-clip", "cpu-1x2");
  sp::Plan plan = f.plan(sp::Strategy::sequential);
  for (sp::Wave& w : plan.waves)
    for (sp::Slice& s : w.slices) {
      const sp::PlanMetaOp& m = plan.metaops[static_cast<size_t>(s.metaop)];
      s.devices = {m.workload.op == "contrastive_loss" ? 1 : 0};
    }
  auto lowered = sp::lower(plan, f.model, f.graph);
  REQUIRE(lowered.ok());
  const auto ctx = sp::lower_context(f.model, f.graph);
  REQUIRE(ctx.ok());
  check_invariants(plan, *lowered, *ctx);
  int64_t expected = 0;  // bytes of every embedding entering a loss: B x dim x 4, per input
  for (const sp::PlanMetaOp& m : plan.metaops)
    if (m.workload.op == "contrastive_loss")
      expected += 2 * m.workload.batch * m.workload.dims.at("dim").get<int64_t>() * 4;
  REQUIRE(expected > 0);
  CHECK(lowered->bytes(0).sent == expected);
  CHECK(lowered->bytes(1).received == expected);
  CHECK(lowered->bytes(1).sent == expected);      // the gradients go back
  CHECK(lowered->bytes(0).received == expected);
  CHECK(lowered->buckets.empty());                // no parameter on two devices
  // Each embedding's gradient comes back to device 0 in one piece of all
  // its rows: taken as it is, nothing zeroed or added.
  int back_to_0 = 0;
  for (const sp::Transfer& tr : lowered->transfers)
    if (tr.dir == sp::Direction::backward && tr.dst == 0) {
      CHECK_FALSE(tr.adds);
      ++back_to_0;
    }
  CHECK(back_to_0 >= 2);
  CHECK(check_adds(*lowered) == std::pair{back_to_0, 0});
  // Early transfers (the default): device 0 sends each embedding right
  // after the forward that made it, in no exchange; device 1 posts the
  // first loss's receives first thing (the others one exchange ahead), and
  // sends the embeddings' gradients right after each loss's backward.
  const sp::Program& p0 = lowered->programs[0];
  const sp::Program& p1 = lowered->programs[1];
  int64_t posted0 = 0, posted1 = 0;
  for (size_t i = 0; i < p0.instrs.size(); ++i) {
    const sp::Instr& in = p0.instrs[i];
    if (in.kind == sp::InstrKind::exchange)
      for (int t : p0.transfers_of(in)) CHECK(lowered->transfers[static_cast<size_t>(t)].dst == 0);
    if (in.kind != sp::InstrKind::post_send) continue;
    CHECK(p0.instrs[i - 1].kind == sp::InstrKind::forward);
    CHECK(f.graph.ops[static_cast<size_t>(lowered->slices[static_cast<size_t>(in.slice)].ops.back())].workload.op ==
          "pool_project");
    for (int t : p0.transfers_of(in)) posted0 += lowered->transfers[static_cast<size_t>(t)].bytes;
  }
  CHECK(posted0 == expected);
  REQUIRE(p1.instrs.size() >= 2);
  CHECK(p1.instrs[0].kind == sp::InstrKind::post_recv);
  for (const sp::Instr& in : p1.instrs)
    if (in.kind == sp::InstrKind::post_recv)
      for (int t : p1.transfers_of(in)) posted1 += lowered->transfers[static_cast<size_t>(t)].bytes;
  CHECK(posted1 == expected);
  size_t sends1 = 0;
  for (size_t i = 0; i < p1.instrs.size(); ++i)
    if (p1.instrs[i].kind == sp::InstrKind::post_send) {
      CHECK(p1.instrs[i - 1].kind == sp::InstrKind::backward);
      ++sends1;
    }
  CHECK(sends1 >= 1);
  // Device 0 receives nothing in the forward pass: it posts the receives of
  // its first backward exchange that has any first thing.
  CHECK(p0.instrs[0].kind == sp::InstrKind::post_recv);
  CHECK(p0.instrs[0].dir == sp::Direction::backward);
  // Without early transfers, sends are in their exchanges again, and there
  // is no post_send or post_recv.
  sp::LowerOptions late;
  late.sync = sp::GradSync{};
  late.sync->early_transfers = false;
  auto at_exchanges = sp::lower(plan, f.model, f.graph, late);
  REQUIRE(at_exchanges.ok());
  check_invariants(plan, *at_exchanges, *ctx);
  for (const sp::Program& prog : at_exchanges->programs)
    for (const sp::Instr& in : prog.instrs)
      CHECK((in.kind != sp::InstrKind::post_send && in.kind != sp::InstrKind::post_recv));
}

TEST_CASE("lowering keeps its invariants on every shipped workload and strategy") {
  const fs::path root = SPINDLE_SOURCE_DIR;
  int lowered_plans = 0;
  int started_earlier = 0;   // bucket starts that come earlier when ready than in order
  int starts_checked = 0;    // bucket starts checked to stand right after their last backward
  int pieces_taken = 0, pieces_added = 0;   // backward pieces, over every plan (check_adds)
  bool matter_both_ways[2] = {false, false};   // plans whose bucket rule matters, and plans whose does not
  int copied_parts = 0;   // copies of part of a parameter's whole tensors (a chunk: check_copies)
  for (const auto& [model, cluster] : std::vector<std::pair<std::string, std::string>>{
           {"tiny-clip", "cpu-1x3"}, {"tiny-clip", "cpu-1x4"}, {"tiny-lm", "cpu-1x3"}, {"tiny-lm", "cpu-1x4"},
           {"multitask-clip-10", "a800-4x8"}, {"ofasys-7", "a800-2x8"}, {"qwen-val-3", "a800-4x8"}}) {
    if (sp::testing::profile_left_out_when_sanitized(model, cluster)) continue;
    Fixture f(model, cluster);
    // One context for the plans of every strategy, as the planner shares
    // one among its candidates.
    const auto context = sp::lower_context(f.model, f.graph);
    REQUIRE(context.ok());
    for (sp::Strategy s : {sp::Strategy::spindle, sp::Strategy::sequential, sp::Strategy::task_level,
                           sp::Strategy::intra_task}) {
      INFO(model << " on " << cluster << ", " << sp::strategy_name(s));
      // Planned as auto's first attempt (replicated, placed counting the
      // state sharded), not its second search: the sharded programs are
      // checked below from this plan, both ways of gathering.
      sp::PlanRequest request{&f.model, &f.graph, &f.cluster, f.cost.get(), "", s};
      sp::testing::as_first_attempt(request);
      auto plan = sp::make_plan(request);
      if (!plan.ok()) continue;  // a strategy not available for this model
      auto lowered = sp::lower(*plan, f.model, f.graph);
      REQUIRE(lowered.ok());
      check_invariants(*plan, *lowered, *context);
      const auto [taken, added] = check_adds(*lowered);
      pieces_taken += taken;
      pieces_added += added;
      // The other bucket starts (in order <-> when ready): the same
      // programs but for where each allreduce_start stands, never later
      // when ready than in order.
      sp::Plan flipped = *plan;
      flipped.bucket_starts = sp::other_rule(plan->bucket_starts);
      auto other = sp::lower(flipped, f.model, f.graph);
      REQUIRE(other.ok());
      check_invariants(flipped, *other, *context);
      const sp::Lowered& ready = plan->bucket_starts == sp::BucketStarts::when_ready ? *lowered : *other;
      const sp::Lowered& ordered = plan->bucket_starts == sp::BucketStarts::when_ready ? *other : *lowered;
      // bucket_starts_matter says exactly whether the two rules' programs
      // differ (the planner skips simulating the other rule when not).
      CHECK(ready.bucket_starts_matter == ordered.bucket_starts_matter);
      bool programs_differ = false;
      for (int d = 0; d < plan->devices; ++d) {
        const sp::Program& a = ready.programs[static_cast<size_t>(d)];
        const sp::Program& b = ordered.programs[static_cast<size_t>(d)];
        programs_differ = programs_differ || a.instrs.size() != b.instrs.size() ||
                          !std::equal(a.instrs.begin(), a.instrs.end(), b.instrs.begin(), [](const sp::Instr& x, const sp::Instr& y) {
                            return x.kind == y.kind && x.slice == y.slice && x.bucket == y.bucket && x.wave == y.wave;
                          });
      }
      CHECK(programs_differ == ordered.bucket_starts_matter);
      matter_both_ways[ordered.bucket_starts_matter ? 1 : 0] = true;
      for (int d = 0; d < plan->devices; ++d) {
        // Position of each bucket's start among the program's other instructions.
        auto starts = [](const sp::Program& prog, std::vector<std::pair<sp::InstrKind, int>>& rest) {
          std::map<int, size_t> at;
          rest.clear();
          for (const sp::Instr& in : prog.instrs) {
            if (in.kind == sp::InstrKind::allreduce_start) at[in.bucket] = rest.size();
            else rest.push_back({in.kind, in.slice >= 0 ? in.slice : in.bucket});
          }
          return at;
        };
        std::vector<std::pair<sp::InstrKind, int>> rest_ready, rest_ordered;
        const auto at_ready = starts(ready.programs[static_cast<size_t>(d)], rest_ready);
        const auto at_ordered = starts(ordered.programs[static_cast<size_t>(d)], rest_ordered);
        CHECK(rest_ready == rest_ordered);
        REQUIRE(at_ready.size() == at_ordered.size());
        for (const auto& [bucket, pos] : at_ready) {
          CHECK(pos <= at_ordered.at(bucket));
          if (pos < at_ordered.at(bucket)) ++started_earlier;
        }
        // When ready, exactly: each start follows (past other starts and
        // post_sends) the last backward on d that uses one of its bucket's
        // parameters, and no backward after it uses one.
        const sp::Program& prog = ready.programs[static_cast<size_t>(d)];
        auto uses = [&](const sp::Instr& in, int bucket) {
          const std::vector<int>& params = ready.buckets[static_cast<size_t>(bucket)].params;
          for (int o : ready.slices[static_cast<size_t>(in.slice)].ops)
            if (std::find(params.begin(), params.end(), context->params.of_op[static_cast<size_t>(o)]) != params.end())
              return true;
          return false;
        };
        for (size_t i = 0; i < prog.instrs.size(); ++i) {
          if (prog.instrs[i].kind != sp::InstrKind::allreduce_start) continue;
          const int bucket = prog.instrs[i].bucket;
          size_t before = i;
          while (before > 0 && prog.instrs[before].kind != sp::InstrKind::backward) --before;
          REQUIRE(prog.instrs[before].kind == sp::InstrKind::backward);
          CHECK(uses(prog.instrs[before], bucket));
          auto used = [&](const sp::Instr& in) { return in.kind == sp::InstrKind::backward && uses(in, bucket); };
          CHECK_FALSE(std::any_of(prog.instrs.begin() + static_cast<std::ptrdiff_t>(i) + 1, prog.instrs.end(), used));
          ++starts_checked;
        }
      }
      // Without overlap: the same programs but for the all-reduces, one
      // blocking one per bucket after the backward pass, and one optimizer
      // step at the end instead of one per bucket and one for the rest.
      // (Compared with the overlapped programs without early transfers;
      // with them, below.)
      sp::LowerOptions blocking;
      blocking.sync = sp::planned_sync(*plan);
      blocking.sync->overlap = false;
      auto after = sp::lower(*plan, f.model, f.graph, blocking);
      REQUIRE(after.ok());
      check_invariants(*plan, *after, *context);
      sp::LowerOptions late;
      late.sync = sp::planned_sync(*plan);
      late.sync->early_transfers = false;
      auto at_exchanges = sp::lower(*plan, f.model, f.graph, late);
      REQUIRE(at_exchanges.ok());
      check_invariants(*plan, *at_exchanges, *context);
      // With the gradient norm (GradSync::grad_norm): the same programs
      // but for one norm_sum and one grad_norm each, before the optimizer
      // steps.
      sp::LowerOptions norm;
      norm.sync = sp::planned_sync(*plan);
      norm.sync->grad_norm = true;
      auto normed = sp::lower(*plan, f.model, f.graph, norm);
      REQUIRE(normed.ok());
      CHECK(normed->grad_norm);
      CHECK(normed->all_devices.size() == static_cast<size_t>(plan->devices));
      check_invariants(*plan, *normed, *context);
      for (int d = 0; d < plan->devices; ++d) {
        auto kinds = [](const sp::Program& prog, bool with_norm) {
          std::multiset<std::pair<sp::InstrKind, int>> all;
          for (const sp::Instr& in : prog.instrs)
            if (with_norm || (in.kind != sp::InstrKind::grad_norm && in.kind != sp::InstrKind::norm_sum))
              all.insert({in.kind, in.slice >= 0 ? in.slice : in.bucket});
          return all;
        };
        const sp::Program& with = normed->programs[static_cast<size_t>(d)];
        CHECK(kinds(with, false) == kinds(lowered->programs[static_cast<size_t>(d)], true));
        CHECK(kinds(with, true).size() == with.instrs.size());
        CHECK(normed->bytes(d) == lowered->bytes(d));   // the norm's value is in no byte count
      }
      for (int d = 0; d < plan->devices; ++d) {
        auto without_reductions = [](const sp::Program& prog) {
          std::vector<std::pair<sp::InstrKind, int>> kept;
          for (const sp::Instr& in : prog.instrs)
            if (in.kind != sp::InstrKind::allreduce && in.kind != sp::InstrKind::allreduce_start &&
                in.kind != sp::InstrKind::allreduce_wait && in.kind != sp::InstrKind::allgather &&
                in.kind != sp::InstrKind::allgather_start && in.kind != sp::InstrKind::allgather_wait &&
                !(in.kind == sp::InstrKind::optimizer && in.bucket >= 0))   // a bucket's step
              kept.push_back({in.kind, in.kind == sp::InstrKind::exchange ? in.wave : in.slice});
          return kept;
        };
        CHECK(without_reductions(at_exchanges->programs[static_cast<size_t>(d)]) ==
              without_reductions(after->programs[static_cast<size_t>(d)]));
        // Early transfers: the same compute and all-reduces in the same
        // order, and the same transfers, only posted elsewhere.
        auto compute_and_sync = [](const sp::Program& prog) {
          std::vector<std::pair<sp::InstrKind, int>> kept;
          for (const sp::Instr& in : prog.instrs)
            if (in.kind != sp::InstrKind::exchange && in.kind != sp::InstrKind::post_send &&
                in.kind != sp::InstrKind::post_recv && in.kind != sp::InstrKind::wait_sends)
              kept.push_back({in.kind, in.slice >= 0 ? in.slice : in.bucket});
          return kept;
        };
        auto transfers_in = [](const sp::Program& prog) {
          std::multiset<int> all;
          for (const sp::Instr& in : prog.instrs)
            if (in.kind == sp::InstrKind::exchange || in.kind == sp::InstrKind::post_send)
              for (int t : prog.transfers_of(in)) all.insert(t);
          return all;
        };
        CHECK(compute_and_sync(lowered->programs[static_cast<size_t>(d)]) ==
              compute_and_sync(at_exchanges->programs[static_cast<size_t>(d)]));
        CHECK(transfers_in(lowered->programs[static_cast<size_t>(d)]) ==
              transfers_in(at_exchanges->programs[static_cast<size_t>(d)]));
      }
      // The optimizer state sharded (ZeRO-1), overlapped (the values'
      // all-gathers at the step's start) and blocking (after the step).
      sp::Plan sharded = *plan;
      sharded.optimizer_state = sp::OptimizerState::sharded;
      for (bool overlap : {true, false})
        for (sp::ParamGather gather : {sp::ParamGather::after_step, sp::ParamGather::next_step}) {
          sharded.param_gather = gather;
          sp::LowerOptions zero1;
          zero1.sync = sp::planned_sync(sharded);
          zero1.sync->overlap = overlap;
          // The gradient norm too, on two of the four (each pass costs time).
          zero1.sync->grad_norm = overlap == (gather == sp::ParamGather::next_step);
          auto z = sp::lower(sharded, f.model, f.graph, zero1);
          REQUIRE(z.ok());
          check_invariants(sharded, *z, *context);
          copied_parts += check_copies(*z, *context);
        }
      // Deterministic: the same programs and transfers twice (compared as
      // data: their JSON, every device's, took a third of this test's time
      // under the sanitizers), and the same file.
      auto again = sp::lower(*plan, f.model, f.graph);
      REQUIRE(again.ok());
      CHECK(lowered->transfers == again->transfers);
      CHECK(lowered->buckets == again->buckets);
      CHECK(lowered->programs == again->programs);
      CHECK(sp::program_json(*lowered, f.graph, 0) == sp::program_json(*again, f.graph, 0));
      // The planner's lite lowering (no deps, no executor maps; in two
      // stages with the shared context): the same instructions, transfers
      // and buckets.
      const sp::LowerOptions lite = sp::simulation_lowering();
      auto bare = sp::lower_header(*plan, *context, lite);
      REQUIRE(bare.ok());
      REQUIRE(sp::lower_programs(*plan, *context, *bare, lite).ok());
      CHECK(bare->shard_devices.empty());
      CHECK(bare->buckets.size() == lowered->buckets.size());
      CHECK(bare->transfers.size() == lowered->transfers.size());
      for (size_t b = 0; b < bare->buckets.size(); ++b) {
        CHECK(bare->buckets[b].devices == lowered->buckets[b].devices);
        CHECK(bare->buckets[b].shards.empty());
        CHECK(bare->buckets[b].params == lowered->buckets[b].params);
        CHECK(bare->buckets[b].bytes == lowered->buckets[b].bytes);
      }
      for (size_t t = 0; t < bare->transfers.size(); ++t)
        CHECK((bare->transfers[t].src == lowered->transfers[t].src && bare->transfers[t].dst == lowered->transfers[t].dst &&
               bare->transfers[t].bytes == lowered->transfers[t].bytes && bare->transfers[t].wave == lowered->transfers[t].wave));
      for (int d = 0; d < plan->devices; ++d) {
        const sp::Program& full_prog = lowered->programs[static_cast<size_t>(d)];
        const sp::Program& lean_prog = bare->programs[static_cast<size_t>(d)];
        const auto& full = full_prog.instrs;
        const auto& lean = lean_prog.instrs;
        REQUIRE(full.size() == lean.size());
        CHECK(lean_prog.deps.empty());
        CHECK(full_prog.deps.size() == full.size());
        for (size_t i = 0; i < full.size(); ++i) {
          CHECK((lean[i].kind == full[i].kind && lean[i].wave == full[i].wave && lean[i].dir == full[i].dir &&
                 lean[i].slice == full[i].slice && std::ranges::equal(lean_prog.transfers_of(lean[i]), full_prog.transfers_of(full[i])) &&
                 lean[i].bucket == full[i].bucket && lean[i].values == full[i].values));
        }
      }
      ++lowered_plans;
    }
  }
  CHECK(lowered_plans >= 20);
  INFO("copies of a chunk: " << copied_parts << "; copy sets alike " << copies_alike << ", copied " << copies_made);
  CHECK(copied_parts > 0);   // the chunked copies are checked somewhere
  CHECK(copies_alike > 0);   // and both kinds of copy set
  CHECK(copies_made > 0);
  CHECK(started_earlier > 0);   // the two rules differ somewhere
  CHECK(starts_checked > 0);
  CHECK(matter_both_ways[0]);
  CHECK(matter_both_ways[1]);
  // Both kinds of backward piece occur: taken whole and added.
  CHECK(pieces_taken > 0);
  CHECK(pieces_added > 0);
}

TEST_CASE("lowering rejects a plan that does not match the model, naming what is wrong") {
  Fixture f("tiny-clip", "cpu-1x2");
  sp::Plan plan = f.plan(sp::Strategy::sequential);
  sp::Plan bad = plan;
  bad.metaops[0].operators[0] = "no/such/0.0";
  auto a = sp::lower(bad, f.model, f.graph);
  REQUIRE_FALSE(a.ok());
  CHECK(a.error().message.find("no/such/0.0") != std::string::npos);
  // A later operator of a MetaOp (found by the next graph index when well
  // named): misnamed, it is reported too; out of chain order, the plan is
  // rejected (the lowering finds them by name, not by position).
  size_t chain = 0;
  while (chain < plan.metaops.size() && plan.metaops[chain].operators.size() < 2) ++chain;
  REQUIRE(chain < plan.metaops.size());
  bad = plan;
  bad.metaops[chain].operators[1] = "no/such/1.0";
  auto later = sp::lower(bad, f.model, f.graph);
  REQUIRE_FALSE(later.ok());
  CHECK(later.error().message.find("no/such/1.0") != std::string::npos);
  bad = plan;
  std::swap(bad.metaops[chain].operators[0], bad.metaops[chain].operators[1]);
  auto swapped = sp::lower(bad, f.model, f.graph);
  REQUIRE_FALSE(swapped.ok());
  INFO(swapped.error().message);
  CHECK(swapped.error().message.find("runs no later than its input") != std::string::npos);
  // A graph that is not the model's (tiny-clip's three tasks against
  // tiny-lm's): an error, not a read past the model's tasks.
  Fixture lm("tiny-lm", "cpu-1x2");
  REQUIRE(lm.model.tasks.size() < f.model.tasks.size());
  auto mismatched = sp::lower(plan, lm.model, f.graph);
  REQUIRE_FALSE(mismatched.ok());
  CHECK(mismatched.error().message.find("is not of the model's graph") != std::string::npos);
  bad = plan;
  bad.waves[0].index = 7;   // the exchanges are numbered by wave position
  auto misnumbered = sp::lower(bad, f.model, f.graph);
  REQUIRE_FALSE(misnumbered.ok());
  CHECK(misnumbered.error().message.find("waves[0].index is 7") != std::string::npos);
  bad = plan;
  bad.waves[0].slices[0].devices = {0, 1, 2};
  auto b = sp::lower(bad, f.model, f.graph);
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().message.find("outside the plan") != std::string::npos);
  bad = plan;
  std::swap(bad.waves.front(), bad.waves.back());
  for (size_t w = 0; w < bad.waves.size(); ++w) bad.waves[w].index = static_cast<int>(w);
  auto c = sp::lower(bad, f.model, f.graph);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().message.find("runs no later than its input") != std::string::npos);
}

TEST_CASE("program JSON: versioned, one document per device, with the byte totals") {
  Fixture f("tiny-lm", "cpu-1x3");
  const sp::Plan plan = f.plan();
  auto l = sp::lower(plan, f.model, f.graph);
  REQUIRE(l.ok());
  for (int d = 0; d < plan.devices; ++d) {
    const auto doc = nlohmann::json::parse(sp::program_json(*l, f.graph, d));
    CHECK(doc.at("format") == "spindle-program");
    CHECK(doc.at("version") == sp::kProgramVersion);
    CHECK(doc.at("device") == d);
    CHECK(doc.at("bytes").at("sent").get<int64_t>() == l->bytes(d).sent);
    CHECK(doc.at("instructions").size() == l->programs[static_cast<size_t>(d)].instrs.size());
  }
}

TEST_CASE("sync_for_run: the plan's gradient sync unless a flag overrides it, with a note for each that does") {
  sp::Plan plan;
  plan.overlap = true;
  plan.early_transfers = true;
  plan.bucket_bytes = 10485;
  std::vector<std::string> notes;
  // No flag: what the plan was made with.
  sp::GradSync sync = sp::sync_for_run(plan, {}, notes);
  CHECK(sync == sp::planned_sync(plan));
  CHECK(sync.overlap);
  CHECK(sync.early_transfers);
  CHECK(sync.bucket_bytes == 10485);
  CHECK(notes.empty());
  // The plan's own value given again: no note.
  sp::SyncFlags same;
  same.bucket_bytes = 10485;
  sync = sp::sync_for_run(plan, same, notes);
  CHECK(sync.bucket_bytes == 10485);
  CHECK(notes.empty());
  // Each flag that changes the programs: in effect, and noted.
  sp::SyncFlags all;
  all.no_overlap = true;
  all.no_early_transfers = true;
  all.bucket_bytes = sp::kDefaultBucketBytes;
  sync = sp::sync_for_run(plan, all, notes);
  CHECK_FALSE(sync.overlap);
  CHECK_FALSE(sync.early_transfers);
  CHECK(sync.bucket_bytes == sp::kDefaultBucketBytes);
  REQUIRE(notes.size() == 3);
  CHECK_THAT(notes[0], Catch::Contains("--no-overlap"));
  CHECK_THAT(notes[1], Catch::Contains("--no-early-transfers"));
  CHECK_THAT(notes[2], Catch::Contains("--bucket-mb 25") && Catch::Contains("0.01 MiB"));
  // A plan made with --no-overlap runs blocking without the flag; the flag
  // then changes nothing and is not noted.
  notes.clear();
  plan.overlap = false;
  CHECK_FALSE(sp::sync_for_run(plan, {}, notes).overlap);
  sp::SyncFlags blocking;
  blocking.no_overlap = true;
  CHECK_FALSE(sp::sync_for_run(plan, blocking, notes).overlap);
  CHECK(notes.empty());
  // The gradient norm (spindle-run --clip-grad): added, and noted, when the
  // plan lacks it; a plan made with it keeps it with or without the flag.
  CHECK_FALSE(sp::sync_for_run(plan, {}, notes).grad_norm);
  sp::SyncFlags clip;
  clip.grad_norm = true;
  CHECK(sp::sync_for_run(plan, clip, notes).grad_norm);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0] == "the gradient norm before the optimizer (spindle-run --clip-grad, spindle-plan --grad-norm): the "
                    "plan was simulated without it");
  notes.clear();
  plan.grad_norm = true;
  CHECK(sp::sync_for_run(plan, clip, notes).grad_norm);
  CHECK(sp::sync_for_run(plan, {}, notes).grad_norm);
  CHECK(notes.empty());
}
