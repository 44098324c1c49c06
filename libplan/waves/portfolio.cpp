#include "libplan/waves/portfolio.h"

#include <algorithm>
#include <limits>

#include "libplan/util/parallel.h"

namespace spindle::plan {

namespace {

// Level-by-level variants tried for the extended combination only (rollout
// lookahead, widening by size): the defer fraction and the rounding.
struct ExtraVariant {
  double defer_fraction;
  bool level_rounded;
};
constexpr ExtraVariant kExtraVariants[] = {{0.7, false}, {0.3, true}};

// Same slots (MetaOp, operators, device count) in the same order.
bool same_wave(const AbstractWave& a, const AbstractWave& b) {
  if (a.slots.size() != b.slots.size()) return false;
  for (size_t i = 0; i < a.slots.size(); ++i) {
    const AbstractSlot& x = a.slots[i];
    const AbstractSlot& y = b.slots[i];
    if (x.metaop != y.metaop || x.first != y.first || x.count != y.count || x.devices != y.devices) return false;
  }
  return true;
}

// Our rules (greedy, and with a rollout lookahead deferring MetaOps with
// slack or not; widening by remaining work or by size) and the paper's
// Algorithm 1 as written, level by level and, with start_early, also as one
// pool. Variants that never won on the shipped workloads (greedy with
// deferral; one pool widening by size) are left out to save time.
std::vector<ScheduleOptions> portfolio_variants(bool start_early) {
  std::vector<ScheduleOptions> variants;
  for (bool cross : {false, true}) {
    if (cross && !start_early) break;
    for (bool by_work : {true, false}) {
      if (cross && !by_work) continue;
      for (double defer : kDeferFractions) {
        for (int look : {0, kLookahead}) {
          if (look == 0 && defer > 0) continue;
          ScheduleOptions o;
          o.cross_level = cross;
          o.widen_by_work = by_work;
          o.defer_fraction = defer;
          o.lookahead = look;
          variants.push_back(o);
        }
      }
    }
    variants.emplace_back();
    variants.back().cross_level = cross;
    variants.back().paper_rules = true;
  }
  return variants;
}

// One schedule of the portfolio.
struct Draft {
  double ms = 0;                   // compute time
  std::vector<AbstractWave> waves;
  bool level_rounded = false;      // scheduled from the level rounding
  bool by_level = false;           // levels one after another
  const std::vector<ScheduleItem>* with = nullptr;   // the rounding scheduled
  ScheduleOptions options;
};

class Portfolio {
 public:
  explicit Portfolio(const PortfolioInput& in)
      : in_(in), items_(*in.items), level_rounded_(*in.level_rounded), levels_(static_cast<size_t>(in.levels)),
        best_ms_(levels_, std::numeric_limits<double>::infinity()), best_draft_(levels_, 0), level_ms_(levels_) {}

  PortfolioSchedules run() {
    const size_t first_extra = run_variants();
    PortfolioSchedules out;
    // (The paper's rules keep their tails either way: not counted.)
    for (const Draft& d : drafts_)
      out.narrowed_tails = out.narrowed_tails || (!d.options.paper_rules && narrows_tails(*d.with, d.waves));
    best_per_level(first_extra);
    Draft combined = combination();
    best_per_level(drafts_.size());   // best_* now over every draft
    Draft extended = extended_combination();
    out.schedules = candidates(first_extra, combined, extended);
    return out;
  }

 private:
  // A draft of `with` scheduled with `o`, not yet in drafts_.
  Draft make_draft(const std::vector<ScheduleItem>& with, ScheduleOptions o) const {
    o.narrow_tails = in_.narrow_tails;
    Draft d{0, schedule_waves(with, in_.devices, o), &with == &level_rounded_, !o.cross_level, &with, o};
    for (const AbstractWave& w : d.waves) d.ms += w.ms;
    return d;
  }
  bool wider_than_island(const Draft& d) const {
    for (const AbstractWave& w : d.waves)
      for (const AbstractSlot& s : w.slots)
        if (s.devices > in_.island) return true;
    return false;
  }

  // Every variant runs on the paper's rounding; our level-by-level rules
  // widening by work also run on the level rounding. On several islands,
  // each level-by-level lookahead variant whose schedule spreads a slot over
  // more than an island runs again with tails kept inside an island
  // (placement and costing decide whether that pays), its draft right after
  // the uncapped one. Then the extra variants (extra_variant_jobs). Every
  // job runs on parallel threads (the scheduler runs are independent; a
  // capped run follows its uncapped one in the same job), the drafts kept
  // in job order. Returns the index of the first extra variant's draft.
  size_t run_variants() {
    std::vector<std::pair<const std::vector<ScheduleItem>*, ScheduleOptions>> jobs;
    for (const ScheduleOptions& o : portfolio_variants(in_.start_early))
      for (const std::vector<ScheduleItem>* with : {&items_, &level_rounded_}) {
        if (with == &level_rounded_ && (with->empty() || o.cross_level || o.paper_rules || !o.widen_by_work))
          continue;
        jobs.push_back({with, o});
      }
    const size_t variants = jobs.size();
    for (const auto& job : extra_variant_jobs()) jobs.push_back(job);
    std::vector<std::vector<Draft>> drafts(jobs.size());
    parallel_for(jobs.size(), [&](size_t, size_t j) {
      const auto& [with, o] = jobs[j];
      drafts[j].push_back(make_draft(*with, o));
      if (j < variants && !o.paper_rules && !o.cross_level && o.lookahead > 0 && in_.island > 0 &&
          in_.island < in_.devices && wider_than_island(drafts[j].front())) {
        ScheduleOptions capped = o;
        capped.extend_cap = in_.island;
        drafts[j].push_back(make_draft(*with, capped));
      }
    });
    size_t first_extra = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (j == variants) first_extra = drafts_.size();
      for (Draft& d : drafts[j]) drafts_.push_back(std::move(d));
    }
    return variants == jobs.size() ? drafts_.size() : first_extra;
  }

  // Extra level-by-level variants, for the extended combination only (they
  // join neither the candidates of the paper's rounding nor the
  // combination, so those stay what they were): widening by size, MetaOps
  // with under 70% of the largest remaining work deferred on the paper's
  // rounding, under 30% on the level rounding. A deferred MetaOp leaves its
  // devices to widen the critical ones and later takes what they leave
  // (ofasys-7 on 8 devices: level 3 in 112.9 ms instead of 122.0).
  std::vector<std::pair<const std::vector<ScheduleItem>*, ScheduleOptions>> extra_variant_jobs() const {
    std::vector<std::pair<const std::vector<ScheduleItem>*, ScheduleOptions>> jobs;
    for (const ExtraVariant& e : kExtraVariants) {
      const std::vector<ScheduleItem>& with = e.level_rounded ? level_rounded_ : items_;
      if (with.empty()) continue;
      ScheduleOptions o;
      o.lookahead = kLookahead;
      o.defer_fraction = e.defer_fraction;
      o.widen_by_work = false;
      jobs.push_back({&with, o});
    }
    return jobs;
  }

  size_t level_of(const AbstractWave& w) const {
    return static_cast<size_t>(items_[static_cast<size_t>(w.slots.front().metaop)].level);
  }

  // Levels are independent in a level-by-level schedule (a level's waves
  // depend only on its own MetaOps): for each level, the level-by-level
  // draft among the first `end` that runs it fastest (ties: the earlier).
  void best_per_level(size_t end) {
    for (size_t d = 0; d < end; ++d) {
      if (!drafts_[d].by_level) continue;
      std::fill(level_ms_.begin(), level_ms_.end(), 0.0);
      for (const AbstractWave& w : drafts_[d].waves) level_ms_[level_of(w)] += w.ms;
      for (size_t l = 0; l < levels_; ++l)
        if (level_ms_[l] < best_ms_[l] * (1 - 1e-12)) {
          best_ms_[l] = level_ms_[l];
          best_draft_[l] = d;
        }
    }
  }

  // Each level's waves from its best draft: compute time at most every
  // level-by-level draft's.
  Draft combination() const {
    Draft combined;
    for (size_t l = 0; l < levels_; ++l)
      for (const AbstractWave& w : drafts_[best_draft_[l]].waves)
        if (level_of(w) == l) {
          combined.ms += w.ms;
          combined.waves.push_back(w);
        }
    return combined;
  }

  // Beyond the paper: each level may also start in the idle devices (in no
  // slot) of the last waves before it (fill_idle), when rescheduling the
  // level after that (with its draft's options and rounding) finishes it
  // sooner. The filled waves keep their length, so its compute time is at
  // most the combination's (over every draft).
  Draft extended_combination() const {
    Draft extended;
    for (size_t l = 0; l < levels_; ++l) {
      const Draft& src = drafts_[best_draft_[l]];
      std::vector<AbstractWave> best_before, best_level;
      double best_level_ms = best_ms_[l];
      for (int k = 1; l > 0 && k <= kFillWaves && static_cast<size_t>(k) <= extended.waves.size(); ++k) {
        std::vector<AbstractWave> before = extended.waves;
        if (fill_idle(*src.with, in_.devices, before, before.size() - static_cast<size_t>(k), static_cast<int>(l)) ==
            0)
          continue;
        std::vector<AbstractWave> rest =
            schedule_level(*src.with, in_.devices, src.options, before, static_cast<int>(l));
        double ms = 0;
        for (const AbstractWave& w : rest) ms += w.ms;
        if (ms < best_level_ms * (1 - 1e-9)) {
          best_level_ms = ms;
          best_before = std::move(before);
          best_level = std::move(rest);
        }
      }
      if (!best_before.empty()) {
        extended.waves = std::move(best_before);
        for (AbstractWave& w : best_level) extended.waves.push_back(std::move(w));
      } else {
        for (const AbstractWave& w : src.waves)
          if (level_of(w) == l) extended.waves.push_back(w);
      }
    }
    for (const AbstractWave& w : extended.waves) extended.ms += w.ms;
    return extended;
  }

  // The shortest kScheduleCandidates distinct drafts of the paper's rounding
  // within kCandidateSlack of the shortest of them (stable: ties keep the
  // variant order), as before the combination existed, so no plan gets
  // worse; then the combination and the extended combination, each when
  // distinct and within the same window. They do not take another's place:
  // compute time is a poor guide to transfers and gradient sync, and a
  // schedule a little longer may place much better.
  std::vector<std::vector<AbstractWave>> candidates(size_t first_extra, Draft& combined, Draft& extended) {
    std::vector<Draft*> nearest;
    for (size_t d = 0; d < first_extra; ++d)
      if (!drafts_[d].level_rounded) nearest.push_back(&drafts_[d]);
    std::stable_sort(nearest.begin(), nearest.end(), [](const Draft* a, const Draft* b) { return a->ms < b->ms; });
    const double window_ms = nearest.front()->ms * (1 + kCandidateSlack);
    std::vector<std::vector<AbstractWave>> out;
    auto add = [&](Draft& d) {
      if (d.ms > window_ms) return;
      for (const auto& o : out)
        if (same_schedule(o, d.waves)) return;
      out.push_back(std::move(d.waves));
    };
    for (Draft* d : nearest) {
      if (static_cast<int>(out.size()) == kScheduleCandidates) break;
      add(*d);
    }
    const double combined_ms = combined.ms;
    add(combined);
    if (extended.ms < combined_ms * (1 - 1e-9)) add(extended);
    return out;
  }

  const PortfolioInput& in_;
  const std::vector<ScheduleItem>& items_;
  const std::vector<ScheduleItem>& level_rounded_;
  size_t levels_;
  std::vector<Draft> drafts_;
  std::vector<double> best_ms_;
  std::vector<size_t> best_draft_;
  std::vector<double> level_ms_;
};

}  // namespace

bool same_schedule(const std::vector<AbstractWave>& a, const std::vector<AbstractWave>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), same_wave);
}

PortfolioSchedules schedule_portfolio(const PortfolioInput& in) {
  return Portfolio(in).run();
}

}  // namespace spindle::plan
