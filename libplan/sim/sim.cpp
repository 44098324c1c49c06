#include "libplan/sim/sim.h"

#include <algorithm>
#include <cstdint>
#include <queue>
#include <tuple>
#include <utility>

namespace spindle::plan {

namespace {

// An event: a message delivered (kind 0, index = transfer), a device ready
// for instruction `index` of its program (kind 1), or a device done with the
// software part of exchange `index` before its messages leave (kind 2:
// packed). Deliveries at one time come first, so links they free are seen by
// devices arriving then.
// Ordered by (t, kind, device, index): the three non-negative ints are
// packed into one key (kind: 2 bits, device and index: 31 bits each) so
// that the queue compares a double and an integer.
struct Event {
  double t = 0;
  uint64_t key = 0;
  Event(double time, int kind, int device, int index)
      : t(time),
        key(static_cast<uint64_t>(kind) << 62 | static_cast<uint64_t>(device) << 31 | static_cast<uint64_t>(index)) {}
  int kind() const { return static_cast<int>(key >> 62); }
  int device() const { return static_cast<int>((key >> 31) & 0x7fffffffu); }
  int index() const { return static_cast<int>(key & 0x7fffffffu); }
  // Without branches (& and |, not && and ||): the heap compares a lot.
  bool operator>(const Event& o) const { return (t > o.t) | ((t == o.t) & (key > o.key)); }
};
constexpr int kDelivered = 0;
constexpr int kReady = 1;
constexpr int kPacked = 2;

// When one instruction of one device ran: reached (the previous one was
// done), began (its work started: the all-reduce's start; else reached),
// ended. Exchanges: packed (its software part before the messages leave was
// done; -1 until then) and unpack_ms (its software part after the last
// message arrived).
struct InstrTimes {
  double reached = 0, began = 0, ended = 0;
  double packed = -1, unpack_ms = 0;
};

// How long bucket `b`'s all-reduce takes once its whole group is there, as
// the simulation and its lower bound price it.
double bucket_ms(const Bucket& b, const CostModel& cost, const SimOptions& options) {
  return options.price_communication && b.devices.size() >= 2
             ? cost.allreduce_ms(static_cast<double>(b.bytes), b.devices)
             : 0.0;
}

// Slice s's share of its ms spent in its forward: its own when listed
// (SimOptions::slice_forward_share), else the one for every slice.
double forward_share_of(const SimOptions& options, size_t s) {
  return s < options.slice_forward_share.size() ? options.slice_forward_share[s] : options.forward_share;
}

// What a simulation that passed its stop_after_ms returns.
Simulation stopped_at_bound() {
  Simulation stopped;
  stopped.iteration_ms = std::numeric_limits<double>::infinity();
  return stopped;
}

// Length of the union of `spans` clipped to [lo, hi].
double covered_ms(std::vector<std::pair<double, double>> spans, double lo, double hi) {
  std::sort(spans.begin(), spans.end());
  double total = 0, cur_lo = 0, cur_hi = 0;
  bool open = false;
  for (auto [a, b] : spans) {
    a = std::max(a, lo);
    b = std::min(b, hi);
    if (b <= a) continue;
    if (open && a <= cur_hi) {
      cur_hi = std::max(cur_hi, b);
      continue;
    }
    if (open) total += cur_hi - cur_lo;
    cur_lo = a, cur_hi = b, open = true;
  }
  if (open) total += cur_hi - cur_lo;
  return total;
}

class Simulator {
 public:
  Simulator(const Lowered& l, const std::vector<double>& slice_ms, const CostModel& cost, int devices_per_island,
            const SimOptions& options)
      : l_(l), slice_ms_(slice_ms), cost_(cost), per_island_(devices_per_island), options_(options) {}

  Result<Simulation> run();

 private:
  void ready(int d, int pc, double t);
  void enter_exchange(int d, int pc, double t);
  void packed(int d, int pc, double t);
  void end_exchange(int d, int pc, double t);
  void enter_allreduce(int d, int pc, double t);
  void enter_wait(int d, int pc, double t);
  void enter_wait_sends(int d, int pc, double t);
  void delivered(int transfer, double t);
  // Starts, in order of readiness, every waiting message whose links are
  // all idle, among those that need one of `links` (the links just freed,
  // or a new message's). Invariant between events: no waiting message has
  // all its links idle, so no other message can start.
  void dispatch(const int* links, int n, double t);
  void start(int transfer, double t);
  bool cross_island(const Transfer& tr) const {
    return island_of(tr.src, per_island_) != island_of(tr.dst, per_island_);
  }
  // The links one message needs: one (inside an island) or two.
  struct Links {
    int n = 0;
    int k[2] = {0, 0};
    const int* begin() const { return k; }
    const int* end() const { return k + n; }
  };
  Links compute_links(const Transfer& tr) const;
  const Links& links_of(int transfer) const { return links_[static_cast<size_t>(transfer)]; }
  Simulation collect() const;

  const Lowered& l_;
  const std::vector<double>& slice_ms_;
  const CostModel& cost_;
  const int per_island_;
  const SimOptions options_;

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::vector<int> pc_;                          // by device: instruction reached; size(): done
  // By instruction, flat: device d's instruction pc is at first_[d] + pc.
  std::vector<size_t> first_;                    // by device
  std::vector<InstrTimes> times_;
  std::vector<int> pending_;                     // exchanges: messages not yet delivered
  size_t at(int d, int pc) const { return first_[static_cast<size_t>(d)] + static_cast<size_t>(pc); }
  std::vector<int> src_instr_, dst_instr_;       // by transfer: its exchange in the sender's, receiver's program
  std::vector<Links> links_;                     // by transfer
  std::vector<char> link_busy_;                  // devices inbound, then island uplinks, then island downlinks
  // By link: the messages ready but not started that need it, as (ready, src, transfer).
  // Each list is sorted; a message joins at its sender's current time, so
  // it goes at or near the end, and a list holds the few messages its link
  // has not carried yet: sorted vectors, not trees.
  using Waiting = std::tuple<double, int, int>;
  std::vector<std::vector<Waiting>> waiting_;
  std::vector<SimMessage> messages_;             // by transfer
  std::vector<int> started_;                     // transfers in order of start
  std::vector<int> arrived_;                     // by bucket: devices that reached it (allreduce or its start)
  std::vector<std::vector<std::pair<int, int>>> at_bucket_;   // by bucket: (device, instr) that reached it
  std::vector<double> bucket_begin_, bucket_end_;   // by bucket: when its all-reduce runs; -1 until it does
  std::vector<double> comm_free_;                // by device: when the last all-reduce it is in ends
  std::vector<std::vector<std::pair<int, int>>> at_wait_;     // by bucket: (device, allreduce_wait) blocked there
  std::vector<double> finish_;                   // by device
  std::vector<int> early_left_;                  // by device: messages of its post_sends not yet delivered
  std::vector<int> at_wait_sends_;               // by device: its wait_sends while blocked there, else -1
};

Simulator::Links Simulator::compute_links(const Transfer& tr) const {
  if (!cross_island(tr)) return {1, {tr.dst, 0}};
  const int islands = island_count(l_.devices, per_island_);
  return {2, {l_.devices + island_of(tr.src, per_island_), l_.devices + islands + island_of(tr.dst, per_island_)}};
}

Result<Simulation> Simulator::run() {
  const size_t devices = static_cast<size_t>(l_.devices);
  if (slice_ms_.size() != l_.slices.size())
    return Error{"simulate: " + std::to_string(slice_ms_.size()) + " slice times for " +
                 std::to_string(l_.slices.size()) + " slices"};
  if (l_.programs.size() != devices)
    return Error{"simulate: " + std::to_string(l_.programs.size()) + " programs for " + std::to_string(devices) +
                 " devices"};
  const int islands = island_count(l_.devices, per_island_);
  pc_.assign(devices, 0);
  finish_.assign(devices, 0.0);
  first_.assign(devices + 1, 0);
  for (size_t d = 0; d < devices; ++d) first_[d + 1] = first_[d] + l_.programs[d].instrs.size();
  times_.assign(first_[devices], InstrTimes{});
  pending_.assign(first_[devices], 0);
  src_instr_.assign(l_.transfers.size(), -1);
  dst_instr_.assign(l_.transfers.size(), -1);
  messages_.resize(l_.transfers.size());
  link_busy_.assign(devices + 2 * static_cast<size_t>(islands), 0);
  waiting_.assign(link_busy_.size(), {});
  links_.reserve(l_.transfers.size());
  for (const Transfer& tr : l_.transfers) links_.push_back(compute_links(tr));
  arrived_.assign(l_.buckets.size(), 0);
  at_bucket_.resize(l_.buckets.size());
  bucket_begin_.assign(l_.buckets.size(), -1.0);
  bucket_end_.assign(l_.buckets.size(), -1.0);
  comm_free_.assign(devices, 0.0);
  at_wait_.resize(l_.buckets.size());
  early_left_.assign(devices, 0);
  at_wait_sends_.assign(devices, -1);
  for (size_t d = 0; d < devices; ++d) {
    const Program& prog = l_.programs[d];
    for (size_t i = 0; i < prog.instrs.size(); ++i) {
      const Instr& in = prog.instrs[i];
      if (in.kind != InstrKind::exchange && in.kind != InstrKind::post_send) continue;
      for (int t : prog.transfers_of(in)) {
        const Transfer& tr = l_.transfers[static_cast<size_t>(t)];
        if (tr.src == tr.dst) continue;
        // A post_send does not wait for its messages: nothing pending
        // there; the program's wait_sends waits for them.
        if (in.kind == InstrKind::exchange) ++pending_[first_[d] + i];
        else ++early_left_[d];
        (tr.src == static_cast<int>(d) ? src_instr_ : dst_instr_)[static_cast<size_t>(t)] = static_cast<int>(i);
      }
    }
  }
  for (size_t t = 0; t < l_.transfers.size(); ++t) {
    const Transfer& tr = l_.transfers[t];
    if (tr.src != tr.dst && (src_instr_[t] < 0 || dst_instr_[t] < 0))
      return Error{"simulate: transfer " + std::to_string(t) + " from device " + std::to_string(tr.src) + " to " +
                   std::to_string(tr.dst) + " is missing from the exchanges and post_sends of either program"};
  }

  {
    // At most one pending event per device and per message in flight.
    std::vector<Event> storage;
    storage.reserve(devices + l_.transfers.size());
    events_ = decltype(events_)(std::greater<Event>(), std::move(storage));
  }
  for (int d = 0; d < l_.devices; ++d) events_.push({0.0, kReady, d, 0});
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    if (e.t > options_.stop_after_ms) {
      return stopped_at_bound();
    }
    if (e.kind() == kDelivered)
      delivered(e.index(), e.t);
    else if (e.kind() == kPacked)
      packed(e.device(), e.index(), e.t);
    else
      ready(e.device(), e.index(), e.t);
  }
  for (int d = 0; d < l_.devices; ++d) {
    const Program& prog = l_.programs[static_cast<size_t>(d)];
    const size_t pc = static_cast<size_t>(pc_[static_cast<size_t>(d)]);
    if (pc < prog.instrs.size()) {
      const Instr& in = prog.instrs[pc];
      return Error{"simulate: device " + std::to_string(d) + " never finishes instruction " + std::to_string(pc) +
                   (in.kind == InstrKind::exchange     ? " (exchange of wave " + std::to_string(in.wave) + ")"
                    : in.kind == InstrKind::wait_sends ? " (wait for its sends)"
                                                       : " (all-reduce of bucket " + std::to_string(in.bucket) + ")")};
    }
  }
  return collect();
}

// Compute instructions touch nothing shared: the device runs through them
// here, and the next event is the one for the instruction after the last of
// them (the same event, at the same time, that running them one event at a
// time would push).
void Simulator::ready(int d, int pc, double t) {
  const Program& prog = l_.programs[static_cast<size_t>(d)];
  const int end = static_cast<int>(prog.instrs.size());
  pc_[static_cast<size_t>(d)] = pc;
  if (pc >= end) {
    finish_[static_cast<size_t>(d)] = t;
    return;
  }
  const Instr& in = prog.instrs[static_cast<size_t>(pc)];
  InstrTimes& times = times_[at(d, pc)];
  times.reached = times.began = t;
  if (in.kind == InstrKind::exchange || in.kind == InstrKind::post_send) return enter_exchange(d, pc, t);
  if (in.kind == InstrKind::allreduce) return enter_allreduce(d, pc, t);
  if (in.kind == InstrKind::allreduce_wait) return enter_wait(d, pc, t);
  if (in.kind == InstrKind::wait_sends) return enter_wait_sends(d, pc, t);
  if (in.kind == InstrKind::allreduce_start) {
    enter_allreduce(d, pc, t);   // the device goes on at once
    return ready(d, pc + 1, t);
  }
  for (;;) {
    const Instr& c = prog.instrs[static_cast<size_t>(pc)];
    double ms = 0;   // the optimizer: 0
    if (c.kind == InstrKind::forward || c.kind == InstrKind::backward) {
      const double fwd = forward_share_of(options_, static_cast<size_t>(c.slice));
      const double share = c.kind == InstrKind::forward ? fwd : 1.0 - fwd;
      ms = options_.price_compute ? slice_ms_[static_cast<size_t>(c.slice)] * share : 0.0;
    }
    InstrTimes& tm = times_[at(d, pc)];
    tm.reached = tm.began = t;
    tm.ended = t + ms;
    t += ms;
    ++pc;
    if (pc >= end) break;
    const InstrKind next = prog.instrs[static_cast<size_t>(pc)].kind;
    if (next != InstrKind::forward && next != InstrKind::backward && next != InstrKind::optimizer &&
        next != InstrKind::post_recv)
      break;
  }
  events_.push({t, kReady, d, pc});
}

// Software overhead (rules/links.h exchange_overhead_ms): the device first
// packs (fixed + per-message + sent bytes), then its messages leave; once
// its last message is delivered it unpacks the received bytes, then goes on.
// A post_send is the first half alone: the device goes on once it has
// packed, its messages move on their own (and an exchange then has only
// the messages it receives).
void Simulator::enter_exchange(int d, int pc, double t) {
  const Program& prog = l_.programs[static_cast<size_t>(d)];
  int messages = 0;
  double sent = 0, received = 0;
  for (int tr : prog.transfers_of(prog.instrs[static_cast<size_t>(pc)])) {
    const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
    if (x.src == x.dst) continue;
    ++messages;
    (x.src == d ? sent : received) += static_cast<double>(x.bytes);
  }
  const CommOverhead o = options_.price_communication ? cost_.overhead() : CommOverhead{};
  const double pack = exchange_overhead_ms(o, messages, sent);
  times_[at(d, pc)].unpack_ms = messages > 0 ? pack_ms(o, received) : 0.0;
  if (pack > 0)
    events_.push({t + pack, kPacked, d, pc});
  else
    packed(d, pc, t);
}

void Simulator::packed(int d, int pc, double t) {
  times_[at(d, pc)].packed = t;
  const Program& prog = l_.programs[static_cast<size_t>(d)];
  for (int tr : prog.transfers_of(prog.instrs[static_cast<size_t>(pc)])) {
    const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
    if (x.src == d && x.dst != d) {
      messages_[static_cast<size_t>(tr)].transfer = tr;
      messages_[static_cast<size_t>(tr)].ready_ms = t;
      const Links& links = links_of(tr);
      for (int k : links) {
        std::vector<Waiting>& list = waiting_[static_cast<size_t>(k)];
        const Waiting key{t, d, tr};
        list.insert(std::upper_bound(list.begin(), list.end(), key), key);
      }
      dispatch(links.begin(), links.n, t);
    }
  }
  if (prog.instrs[static_cast<size_t>(pc)].kind == InstrKind::post_send) {
    times_[at(d, pc)].ended = t;
    events_.push({t, kReady, d, pc + 1});
  } else if (pending_[at(d, pc)] == 0) {
    end_exchange(d, pc, t);
  }
}

// Every message of the exchange is delivered and the device has packed:
// it unpacks, then goes on.
void Simulator::end_exchange(int d, int pc, double t) {
  InstrTimes& times = times_[at(d, pc)];
  times.ended = t + times.unpack_ms;
  events_.push({times.ended, kReady, d, pc + 1});
}

// A device reaches a bucket's all-reduce (blocking) or its start. Members
// at a blocking one go on when it ends; those that started it went on
// already, and those blocked at its wait go on when it ends. A device runs
// one all-reduce at a time (they share its links): an all-reduce begins
// once its whole group has reached it and every member has ended the
// all-reduces that began before, served in the order their groups
// completed. No head-of-line blocking across groups: each group's
// communicator progresses on its own (MPI_Iallreduce on its own
// communicator; NCCL, a stream per group), so one whose group is complete
// need not wait for an earlier-started one whose group is not.
void Simulator::enter_allreduce(int d, int pc, double t) {
  const int b = l_.programs[static_cast<size_t>(d)].instrs[static_cast<size_t>(pc)].bucket;
  const Bucket& bucket = l_.buckets[static_cast<size_t>(b)];
  at_bucket_[static_cast<size_t>(b)].push_back({d, pc});
  if (++arrived_[static_cast<size_t>(b)] < static_cast<int>(bucket.devices.size())) return;
  double begin = t;
  for (int m : bucket.devices) begin = std::max(begin, comm_free_[static_cast<size_t>(m)]);
  const double end = begin + bucket_ms(bucket, cost_, options_);
  for (int m : bucket.devices) comm_free_[static_cast<size_t>(m)] = end;
  bucket_begin_[static_cast<size_t>(b)] = begin;
  bucket_end_[static_cast<size_t>(b)] = end;
  for (auto [m, mpc] : at_bucket_[static_cast<size_t>(b)]) {
    InstrTimes& times = times_[at(m, mpc)];
    times.began = begin;
    times.ended = end;
    if (l_.programs[static_cast<size_t>(m)].instrs[static_cast<size_t>(mpc)].kind == InstrKind::allreduce)
      events_.push({end, kReady, m, mpc + 1});
  }
  for (auto [m, wpc] : at_wait_[static_cast<size_t>(b)]) {
    times_[at(m, wpc)].ended = end;
    events_.push({end, kReady, m, wpc + 1});
  }
}

// The wait for a started all-reduce: done at once if it has ended, else
// when it ends (once it runs: when its last member starts it).
void Simulator::enter_wait(int d, int pc, double t) {
  const int b = l_.programs[static_cast<size_t>(d)].instrs[static_cast<size_t>(pc)].bucket;
  const double end = bucket_end_[static_cast<size_t>(b)];
  if (end < 0) {
    at_wait_[static_cast<size_t>(b)].push_back({d, pc});
    return;
  }
  times_[at(d, pc)].ended = std::max(t, end);
  events_.push({std::max(t, end), kReady, d, pc + 1});
}

// The wait for every message of the device's post_sends: done at once if
// all are delivered, else when the last one is.
void Simulator::enter_wait_sends(int d, int pc, double t) {
  if (early_left_[static_cast<size_t>(d)] > 0) {
    at_wait_sends_[static_cast<size_t>(d)] = pc;
    return;
  }
  times_[at(d, pc)].ended = t;
  events_.push({t, kReady, d, pc + 1});
}

void Simulator::dispatch(const int* links, int n, double t) {
  // Walk the waiting lists of the given links (one or two) merged in order
  // of readiness, a message on both lists once. pos[i]: the next entry of
  // list i not yet looked at.
  std::vector<Waiting>* list[2] = {nullptr, nullptr};
  size_t pos[2] = {0, 0};
  for (int i = 0; i < n; ++i) list[i] = &waiting_[static_cast<size_t>(links[i])];
  auto all_busy = [&] {
    for (int i = 0; i < n; ++i)
      if (!link_busy_[static_cast<size_t>(links[i])]) return false;
    return true;
  };
  while (!all_busy()) {
    int pick = -1;
    for (int i = 0; i < n; ++i)
      if (!link_busy_[static_cast<size_t>(links[i])] && pos[i] < list[i]->size() &&
          (pick < 0 || (*list[i])[pos[i]] < (*list[pick])[pos[pick]]))
        pick = i;
    if (pick < 0) return;
    const Waiting key = (*list[pick])[pos[pick]];
    bool passed[2] = {false, false};
    for (int i = 0; i < n; ++i)
      if (pos[i] < list[i]->size() && (*list[i])[pos[i]] == key) {
        ++pos[i];
        passed[i] = true;
      }
    const int tr = std::get<2>(key);
    const Links& need = links_of(tr);
    if (std::any_of(need.begin(), need.end(), [&](int k) { return link_busy_[static_cast<size_t>(k)] != 0; }))
      continue;
    // Off every list it waits on: those walked here hold it just before pos.
    for (int i = 0; i < n; ++i)
      if (passed[i]) list[i]->erase(list[i]->begin() + static_cast<std::ptrdiff_t>(--pos[i]));
    for (int k : need) {
      if (std::find(links, links + n, k) != links + n) continue;
      std::vector<Waiting>& other = waiting_[static_cast<size_t>(k)];
      other.erase(std::lower_bound(other.begin(), other.end(), key));
    }
    start(tr, t);
  }
}

void Simulator::start(int tr, double t) {
  const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
  SimMessage& m = messages_[static_cast<size_t>(tr)];
  for (int k : links_of(tr)) link_busy_[static_cast<size_t>(k)] = 1;
  const double ms = options_.price_communication ? cost_.p2p_ms(static_cast<double>(x.bytes), cross_island(x)) : 0.0;
  m.start_ms = t;
  m.end_ms = t + ms;
  started_.push_back(tr);
  events_.push({t + ms, kDelivered, x.dst, tr});
}

void Simulator::delivered(int tr, double t) {
  const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
  const Links& links = links_of(tr);
  for (int k : links) link_busy_[static_cast<size_t>(k)] = 0;
  for (auto [d, pc] : {std::pair{x.src, src_instr_[static_cast<size_t>(tr)]},
                       std::pair{x.dst, dst_instr_[static_cast<size_t>(tr)]}}) {
    if (l_.programs[static_cast<size_t>(d)].instrs[static_cast<size_t>(pc)].kind != InstrKind::exchange) {
      // Posted early: its sender went on; its wait_sends may be waiting.
      if (--early_left_[static_cast<size_t>(d)] == 0 && at_wait_sends_[static_cast<size_t>(d)] >= 0) {
        const int wpc = std::exchange(at_wait_sends_[static_cast<size_t>(d)], -1);
        times_[at(d, wpc)].ended = t;
        events_.push({t, kReady, d, wpc + 1});
      }
      continue;
    }
    int& left = pending_[at(d, pc)];
    // The device is blocked in this exchange, has packed, and it is now complete.
    if (--left == 0 && pc_[static_cast<size_t>(d)] == pc &&
        times_[at(d, pc)].packed >= 0)
      end_exchange(d, pc, t);
  }
  dispatch(links.begin(), links.n, t);
}

Simulation Simulator::collect() const {
  Simulation sim;
  sim.devices.resize(static_cast<size_t>(l_.devices));
  for (int d = 0; d < l_.devices; ++d) {
    const Program& prog = l_.programs[static_cast<size_t>(d)];
    SimDevice& dev = sim.devices[static_cast<size_t>(d)];
    dev.finish_ms = finish_[static_cast<size_t>(d)];
    sim.iteration_ms = std::max(sim.iteration_ms, dev.finish_ms);
    if (!options_.timeline) continue;
    for (size_t i = 0; i < prog.instrs.size(); ++i) {
      const Instr& in = prog.instrs[i];
      const InstrTimes& tm = times_[first_[static_cast<size_t>(d)] + i];
      SimBox box;
      box.device = d;
      box.instr = static_cast<int>(i);
      box.start_ms = tm.began;
      box.dur_ms = tm.ended - tm.began;
      switch (in.kind) {
        case InstrKind::forward:
        case InstrKind::backward: {
          const bool fwd = in.kind == InstrKind::forward;
          dev.compute_ms += box.dur_ms;
          box.cat = fwd ? "forward" : "backward";
          box.wave = in.wave;
          box.slice = in.slice;
          box.name = "slice " + std::to_string(in.slice) + (fwd ? " fwd" : " bwd");
          break;
        }
        case InstrKind::optimizer:
          dev.compute_ms += box.dur_ms;
          box.cat = "optimizer";
          box.name = "optimizer";
          if (box.dur_ms <= 0) continue;
          break;
        case InstrKind::post_recv: continue;   // 0 ms, nothing to show
        case InstrKind::wait_sends: {
          // Blocked until its early sends are delivered: transfer while one
          // of them moves, else wait.
          std::vector<std::pair<double, double>> spans;
          for (size_t j = 0; j < i; ++j) {
            if (prog.instrs[j].kind != InstrKind::post_send) continue;
            for (int t : prog.transfers_of(prog.instrs[j]))
              spans.push_back({messages_[static_cast<size_t>(t)].start_ms, messages_[static_cast<size_t>(t)].end_ms});
          }
          const double moving = covered_ms(std::move(spans), tm.reached, tm.ended);
          dev.transfer_ms += moving;
          dev.wait_ms += box.dur_ms - moving;
          if (box.dur_ms <= 0) continue;
          box.track = SimTrack::communication;
          box.cat = "wait";
          box.name = "wait for sends posted early";
          break;
        }
        case InstrKind::post_send: {
          // Packing is the device's work; the messages then move beside
          // whatever it does next.
          dev.transfer_ms += box.dur_ms;
          for (int t : prog.transfers_of(in)) box.sent_bytes += l_.transfers[static_cast<size_t>(t)].bytes;
          box.track = SimTrack::communication;
          box.cat = "send";
          box.wave = in.wave;
          box.slice = in.slice;
          box.name = std::string("post sends ") + (in.dir == Direction::forward ? "fwd" : "bwd") + " of slice " +
                     std::to_string(in.slice);
          break;
        }
        case InstrKind::exchange: {
          std::vector<std::pair<double, double>> spans;
          for (int t : prog.transfers_of(in)) {
            const Transfer& x = l_.transfers[static_cast<size_t>(t)];
            if (x.src == x.dst) continue;
            const SimMessage& m = messages_[static_cast<size_t>(t)];
            spans.push_back({m.start_ms, m.end_ms});
            (x.src == d ? box.sent_bytes : box.received_bytes) += x.bytes;
          }
          // The software parts (packing before, unpacking after) are transfer work too.
          spans.push_back({tm.reached, tm.packed});
          spans.push_back({tm.ended - tm.unpack_ms, tm.ended});
          const double moving = covered_ms(std::move(spans), tm.reached, tm.ended);
          dev.transfer_ms += moving;
          dev.wait_ms += box.dur_ms - moving;
          box.track = SimTrack::communication;
          box.cat = "exchange";
          box.wave = in.wave;
          box.name = std::string("exchange ") + (in.dir == Direction::forward ? "fwd" : "bwd") + " wave " +
                     std::to_string(in.wave);
          break;
        }
        case InstrKind::allreduce_wait: {
          // Blocked from reached to ended: on the collective while it ran
          // (exposed), else waiting for the group to start it. The rest of
          // the collective ran behind this device's other work (hidden).
          const double cb = bucket_begin_[static_cast<size_t>(in.bucket)];
          const double ce = bucket_end_[static_cast<size_t>(in.bucket)];
          const double exposed = std::max(0.0, tm.ended - std::max(tm.reached, cb));
          dev.sync_ms += exposed;
          dev.wait_ms += box.dur_ms - exposed;
          dev.hidden_sync_ms += (ce - cb) - exposed;
          if (box.dur_ms <= 0) continue;
          // On the communication track: it ends with the all-reduce, so it
          // nests with the all-reduce's box there.
          box.track = SimTrack::communication;   // began == reached: the box is the blocked time
          box.cat = "wait";
          box.bucket = in.bucket;
          box.name = "wait for all-reduce of bucket " + std::to_string(in.bucket);
          break;
        }
        case InstrKind::allreduce_start:
        case InstrKind::allreduce: {
          const Bucket& b = l_.buckets[static_cast<size_t>(in.bucket)];
          const bool started = in.kind == InstrKind::allreduce_start;
          if (!started && tm.began > tm.reached) {
            SimBox wait = box;
            wait.track = SimTrack::communication;
            wait.cat = "wait";
            wait.name = "wait for bucket " + std::to_string(in.bucket);
            wait.bucket = in.bucket;
            wait.start_ms = tm.reached;
            wait.dur_ms = tm.began - tm.reached;
            dev.wait_ms += wait.dur_ms;
            sim.boxes.push_back(std::move(wait));
          }
          if (!started) dev.sync_ms += box.dur_ms;   // a started one: counted at its wait
          box.track = SimTrack::communication;
          box.cat = "allreduce";
          box.bucket = in.bucket;
          box.sent_bytes = b.bytes;
          box.name = "all-reduce bucket " + std::to_string(in.bucket) + " (" + std::to_string(b.devices.size()) +
                     " devices)";
          break;
        }
      }
      sim.boxes.push_back(std::move(box));
    }
  }
  if (!options_.timeline) return sim;
  for (SimDevice& dev : sim.devices) dev.idle_ms = sim.iteration_ms - dev.busy_ms();
  for (int t : started_) sim.messages.push_back(messages_[static_cast<size_t>(t)]);
  return sim;
}

}  // namespace

double Simulation::compute_device_ms() const {
  double s = 0;
  for (const SimDevice& d : devices) s += d.compute_ms;
  return s;
}

double Simulation::transfer_device_ms() const {
  double s = 0;
  for (const SimDevice& d : devices) s += d.transfer_ms;
  return s;
}

double Simulation::sync_device_ms() const {
  double s = 0;
  for (const SimDevice& d : devices) s += d.sync_ms;
  return s;
}

double Simulation::hidden_sync_device_ms() const {
  double s = 0;
  for (const SimDevice& d : devices) s += d.hidden_sync_ms;
  return s;
}

std::vector<double> lowered_slice_ms(const Plan& plan) {
  std::vector<double> ms;
  for (const Wave& w : plan.waves)
    for (const Slice& s : w.slices) ms.push_back(s.ms);
  return ms;
}

double device_lower_bound_ms(const Lowered& lowered, const std::vector<double>& slice_ms, const CostModel& cost,
                             const SimOptions& options) {
  const size_t n = static_cast<size_t>(lowered.devices);
  std::vector<double> compute(n, 0.0), forward(n, 0.0), sync(n, 0.0);
  if (options.price_compute)
    for (size_t s = 0; s < lowered.slices.size() && s < slice_ms.size(); ++s)
      for (int d : lowered.slices[s].devices) {
        compute[static_cast<size_t>(d)] += slice_ms[s];
        forward[static_cast<size_t>(d)] += slice_ms[s] * forward_share_of(options, s);
      }
  for (const Bucket& b : lowered.buckets) {
    const double ms = bucket_ms(b, cost, options);
    for (int d : b.devices) sync[static_cast<size_t>(d)] += ms;
  }
  // Blocking: compute, then every all-reduce. Overlapped: a device's
  // all-reduces run one after another, none before its forward pass is done.
  double bound = 0;
  for (size_t d = 0; d < n; ++d)
    bound = std::max(bound, options.sync.overlap ? std::max(compute[d], forward[d] + sync[d]) : compute[d] + sync[d]);
  // Summed in another order than the simulation's clock: a few ulps below.
  return bound * (1 - 1e-12);
}

namespace {
// SimOptions' forward shares: each in [0, 1], one per slice when listed.
Status check_forward_shares(const SimOptions& options, size_t slices) {
  if (!(options.forward_share >= 0 && options.forward_share <= 1))
    return Error{"simulate: forward_share " + std::to_string(options.forward_share) + " is outside [0, 1]"};
  if (options.slice_forward_share.empty()) return {};
  if (options.slice_forward_share.size() != slices)
    return Error{"simulate: " + std::to_string(options.slice_forward_share.size()) + " forward shares for " +
                 std::to_string(slices) + " slices"};
  for (double f : options.slice_forward_share)
    if (!(f >= 0 && f <= 1)) return Error{"simulate: a slice's forward share " + std::to_string(f) + " is outside [0, 1]"};
  return {};
}
}  // namespace

Result<Simulation> simulate(const Lowered& lowered, const std::vector<double>& slice_ms, const CostModel& cost,
                            int devices_per_island, const SimOptions& options) {
  SPINDLE_TRY(check_forward_shares(options, lowered.slices.size()));
  return Simulator(lowered, slice_ms, cost, devices_per_island, options).run();
}

Result<Simulation> simulate_plan(const Plan& plan, const Model& model, const OpGraph& graph, const CostModel& cost,
                                 const SimOptions& options) {
  const Result<LowerContext> context = lower_context(model, graph);
  if (!context) return context.error();
  return simulate_plan(plan, *context, cost, options);
}

Result<Simulation> simulate_plan(const Plan& plan, const LowerContext& context, const CostModel& cost,
                                 const SimOptions& options) {
  // The same instructions, without what only readers and the executor use.
  LowerOptions lite;
  lite.deps = false;
  lite.runtime_maps = false;
  lite.sync = options.sync;
  auto lowered = lower_header(plan, context, lite);
  if (!lowered) return lowered.error();
  const std::vector<double> slice_ms = lowered_slice_ms(plan);
  // Measured forward shares, by slice (its MetaOp's workload), where the
  // profile has them; the others keep options.forward_share.
  const SimOptions* opts = &options;
  SimOptions measured;
  if (cost.has_forward_shares() && options.slice_forward_share.empty()) {
    measured = options;
    measured.slice_forward_share.reserve(lowered->slices.size());
    for (const LoweredSlice& s : lowered->slices) {
      const double f = cost.forward_share(plan.metaops[static_cast<size_t>(s.metaop)].workload);
      measured.slice_forward_share.push_back(f >= 0 ? f : options.forward_share);
    }
    opts = &measured;
  }
  SPINDLE_TRY(check_forward_shares(*opts, lowered->slices.size()));
  // A bounded simulation that cannot finish in time ends before the
  // programs are built.
  if (device_lower_bound_ms(*lowered, slice_ms, cost, *opts) > opts->stop_after_ms) {
    return stopped_at_bound();
  }
  SPINDLE_TRY(lower_programs(plan, context, *lowered, lite));
  // The shares were checked above: the simulator itself, not simulate().
  auto sim = Simulator(*lowered, slice_ms, cost, plan.devices_per_island, *opts).run();
  if (!sim) return sim;
  sim->bucket_starts_matter = lowered->bucket_starts_matter;
  // Name compute boxes after their MetaOps, as the planned trace does.
  for (SimBox& box : sim->boxes) {
    if (box.cat != "forward" && box.cat != "backward") continue;
    const LoweredSlice& s = lowered->slices[static_cast<size_t>(box.slice)];
    const PlanMetaOp& m = plan.metaops[static_cast<size_t>(s.metaop)];
    box.name = m.task + " " + m.workload.op + " x" + std::to_string(s.ops.size()) +
               (box.cat == "forward" ? " fwd" : " bwd");
  }
  return sim;
}

Result<double> simulated_compute_gap(const Plan& plan, const Model& model, const OpGraph& graph,
                                     const CostModel& cost) {
  SimOptions compute_only;
  compute_only.price_communication = false;
  compute_only.timeline = false;
  auto sim = simulate_plan(plan, model, graph, cost, compute_only);
  if (!sim) return sim.error();
  const double relaxed = plan.predicted.relaxed_optimum_ms;
  return relaxed > 0 ? sim->iteration_ms / relaxed - 1.0 : 0.0;
}

}  // namespace spindle::plan
