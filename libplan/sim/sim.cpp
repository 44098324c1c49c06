#include "libplan/sim/sim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
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
// the simulation and its lower bound price it: with sharded optimizer
// state (ZeRO-1) a reduce-scatter of its padded buffer
// (CostModel::reduce_scatter_ms of Lowered::gather_bytes).
double bucket_ms(const Lowered& l, size_t b, const CostModel& cost, const SimOptions& options) {
  const Bucket& k = l.buckets[b];
  if (!options.price_communication || k.devices.size() < 2) return 0.0;
  return l.sharded_state ? cost.reduce_scatter_ms(static_cast<double>(l.gather_bytes(static_cast<int>(b))), k.devices)
                         : cost.allreduce_ms(static_cast<double>(k.bytes), k.devices);
}

// How long bucket `b`'s all-gather (ZeRO-1: Lowered::sharded_state) takes
// once its whole group is there: CostModel::allgather_ms of the bytes it
// leaves on each member (Lowered::gather_bytes). 0 without sharded state
// (the programs have no all-gather).
double gather_ms(const Lowered& l, size_t b, const CostModel& cost, const SimOptions& options) {
  const Bucket& k = l.buckets[b];
  return l.sharded_state && options.price_communication && k.devices.size() >= 2
             ? cost.allgather_ms(static_cast<double>(l.gather_bytes(static_cast<int>(b))), k.devices)
             : 0.0;
}

// How long the grad_norm all-reduce takes once every device is there:
// CostModel::allreduce_ms of kNormBytes over them all.
double norm_ms(const Lowered& l, const CostModel& cost, const SimOptions& options) {
  return options.price_communication && l.all_devices.size() >= 2
             ? cost.allreduce_ms(static_cast<double>(kNormBytes), l.all_devices)
             : 0.0;
}

// The collectives of a lowering, numbered: bucket b's all-reduce is
// collective b, its all-gather (sharded optimizer state) collective
// buckets + b, and with Lowered::grad_norm the gradient norm's all-reduce
// collective 2 x buckets. Every per-collective array of the simulation has
// collective_count entries.
size_t collective_count(const Lowered& l) { return 2 * l.buckets.size() + (l.grad_norm ? 1 : 0); }
// An instruction of a bucket's all-gather: the blocking one, or its start or wait.
bool is_gather(InstrKind k) {
  return k == InstrKind::allgather || k == InstrKind::allgather_start || k == InstrKind::allgather_wait;
}
// The collective instruction `in` (allreduce, allreduce_start,
// allreduce_wait: the bucket's all-reduce; allgather, allgather_start,
// allgather_wait: its all-gather; grad_norm) takes part in.
int collective_of(const Lowered& l, const Instr& in) {
  if (in.kind == InstrKind::grad_norm) return 2 * static_cast<int>(l.buckets.size());
  return is_gather(in.kind) ? static_cast<int>(l.buckets.size()) + in.bucket : in.bucket;
}
// The devices that run collective k: its bucket's, or every device.
const std::vector<int>& group_of(const Lowered& l, int k) {
  if (static_cast<size_t>(k) == 2 * l.buckets.size()) return l.all_devices;
  return l.buckets[static_cast<size_t>(k) % l.buckets.size()].devices;
}
// Compute on the device itself, priced by the cost model (compute_ms) and
// replaced by a replay's measured time: forward, backward, an optimizer
// step or the gradient norm's local sum.
bool is_compute(InstrKind k) {
  return k == InstrKind::forward || k == InstrKind::backward || k == InstrKind::optimizer || k == InstrKind::norm_sum;
}
// A device blocks in it until the collective ends: a blocking all-reduce or all-gather.
bool blocking_collective(InstrKind k) {
  return k == InstrKind::allreduce || k == InstrKind::allgather || k == InstrKind::grad_norm;
}
// The device reaches the collective and goes on at once: allreduce_start, allgather_start.
bool starts_collective(InstrKind k) { return k == InstrKind::allreduce_start || k == InstrKind::allgather_start; }
// The device blocks until a collective it started has ended: allreduce_wait, allgather_wait.
bool waits_collective(InstrKind k) { return k == InstrKind::allreduce_wait || k == InstrKind::allgather_wait; }

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

// The links one message needs: one (inside an island) or two.
struct Links {
  int n = 0;
  int k[2] = {0, 0};
  const int* begin() const { return k; }
  const int* end() const { return k + n; }
};

// The simulator's working memory: one per thread, reused from one run to
// the next (the planner simulates dozens of candidates), so that a run
// allocates only where its programs are larger than any before on its
// thread. Every field is reset at the start of a run; a run must not
// start another on its thread (none does).
struct SimState {
  using Waiting = std::tuple<double, int, int>;
  std::vector<Event> events;                      // a min-heap (std::push_heap with std::greater)
  std::vector<int> pc;                            // by device: instruction reached; size(): done
  // By instruction, flat: device d's instruction pc is at first[d] + pc.
  std::vector<size_t> first;                      // by device
  std::vector<InstrTimes> times;
  std::vector<double> instr_ms;                   // by instruction, flat: Simulator::compute_ms of it
  std::vector<double> forward_ms, backward_ms;    // by slice: Simulator::fill_slice_ms
  std::vector<int> pending;                       // exchanges: messages not yet delivered
  std::vector<int> src_instr, dst_instr;          // by transfer: its exchange in the sender's, receiver's program
  std::vector<Links> links;                       // by transfer
  std::vector<char> link_busy;                    // devices inbound, then island uplinks, then island downlinks
  // By link: the messages ready but not started that need it, as (ready, src, transfer).
  // Each list is sorted; a message joins at its sender's current time, so
  // it goes at or near the end, and a list holds the few messages its link
  // has not carried yet: sorted vectors, not trees.
  std::vector<std::vector<Waiting>> waiting;
  std::vector<SimMessage> messages;               // by transfer
  std::vector<int> started;                       // transfers in order of start
  // By collective (collective_of: bucket b's all-reduce, then its
  // all-gather at buckets + b), the "bucket" arrays below.
  std::vector<int> arrived;                       // by collective: devices that reached it (a blocking
                                                  // allreduce or allgather, or a start)
  std::vector<std::vector<std::pair<int, int>>> at_bucket;  // by collective: (device, instr) that reached it
  std::vector<double> bucket_begin, bucket_end;   // by collective: when it runs; -1 until it does
  std::vector<double> reduce_ms;                  // by collective: bucket_ms or gather_ms under the run's options
  std::vector<double> comm_free;                  // by device: when the last collective it is in ends
  std::vector<std::vector<std::pair<int, int>>> at_wait;  // by collective: (device, its allreduce_wait or
                                                          // allgather_wait) blocked there
  std::vector<double> finish;                     // by device
  std::vector<int> early_left;                    // by device: messages of its post_sends not yet delivered
  std::vector<int> at_wait_sends;                 // by device: its wait_sends while blocked there, else -1
  // With a finite stop_after_ms (else empty): by instruction (flat, as
  // times), the least time its device takes from reaching it to its end,
  // ms (Simulator::fill_time_left); by device, its collectives (all-reduces
  // and all-gathers) that have not begun, ms.
  std::vector<double> time_left;
  std::vector<double> sync_left;
  std::vector<double> after_wait;                 // fill_time_left's scratch, by collective
  // By device, its latest run through instructions that touch nothing
  // shared (Simulator::ready): instructions [chain_begin, chain_end), the
  // last ending at chain_end_t; chain_end_t is the time it reached its
  // current instruction when it is blocked there (no run).
  std::vector<int> chain_begin, chain_end;
  std::vector<double> chain_end_t;
  // Simulator::run_zero_comm's: by device, its clock and whether it waits
  // (at an exchange or a collective); by transfer, when its sender reached the
  // instruction that sends it (-1: not yet); the devices that can go on.
  std::vector<double> clock;
  std::vector<char> parked;
  std::vector<double> sent_at;
  std::vector<int> runnable;
  // What each end waited for last (Simulator::trace_critical_path), by
  // node: instruction ends (flat, as times), then message deliveries (by
  // transfer), then collective ends (by collective); -1: nothing before it.
  std::vector<int> cause;
  std::vector<int> comm_free_bucket;   // by device: the collective whose end set comm_free; -1: none
  std::vector<int> bucket_via;         // by collective whose cause is another collective: the member that
                                       // ran both
  // trace_critical_path's: by instruction (flat, as times), whether it is
  // on the critical path; by collective, the device it is shown on there
  // (-1: not on it).
  std::vector<char> on_path;
  std::vector<int> path_bucket_device;
};

SimState& thread_sim_state() {
  thread_local SimState state;
  return state;
}

class Simulator {
 public:
  Simulator(const Lowered& l, const std::vector<double>& slice_ms, const CostModel& cost, int devices_per_island,
            const SimOptions& options)
      : l_(l), slice_ms_(slice_ms), cost_(cost), per_island_(devices_per_island), options_(options),
        s_(thread_sim_state()) {}

  Result<Simulation> run();
  // program_lower_bound_ms: the largest time_left of a device's first
  // instruction.
  double lower_bound();

 private:
  // s_.first (every device's program) and s_.reduce_ms.
  void index_programs();
  // s_.pending (by exchange: the messages it waits for), s_.early_left,
  // s_.src_instr and s_.dst_instr; an error for a transfer that is in no
  // exchange or post_send of its sender's or receiver's program.
  Status map_transfers();
  // The error for device d, which never got past instruction pc.
  Error never_finishes(int d, size_t pc) const;
  // run() when nothing but compute takes time (SimOptions::timeline and
  // price_communication false): the makespan in one pass over the
  // programs' dependencies, without events (see run_zero_comm).
  Result<Simulation> run_zero_comm();
  void zero_comm_advance(int d);
  // A device reaches collective k at t; `node`: the end its arrival came
  // after (s_.cause).
  void zero_comm_arrive(int k, double t, int node);
  // Device d waits at instruction pc, its clock at t; woken (from another
  // device's advance) it goes on after pc no earlier than t.
  void zero_comm_park(int d, int pc, double t);
  void zero_comm_wake(int d, int pc, double t);
  // s_.instr_ms; fill_time_left fills it too (one pass for both).
  void fill_instr_ms();
  // SimOptions::replay_ms fits the programs.
  Status check_replay() const;
  // When device d's program begins (SimOptions::replay_start_ms), ms.
  double start_ms(int d) const {
    return options_.replay_start_ms.empty() ? 0.0 : options_.replay_start_ms[static_cast<size_t>(d)];
  }
  void fill_time_left();
  void ready(int d, int pc, double t);
  void enter_exchange(int d, int pc, double t);
  void packed(int d, int pc, double t);
  // `why`: the node (s_.cause) its end waited for; -1: its own packing.
  void end_exchange(int d, int pc, double t, int why = -1);
  void enter_allreduce(int d, int pc, double t);
  // The time; `*instr` the compute instruction it ends, else -1.
  double next_poll(int d, double t, int* instr) const;
  void enter_wait_sends(int d, int pc, double t);
  void delivered(int transfer, double t);
  // Starts, in order of readiness, every waiting message whose links are
  // all idle, among those that need one of `links` (the links just freed,
  // or a new message's). Invariant between events: no waiting message has
  // all its links idle, so no other message can start. `freed_by`: the
  // delivery (its node) that freed `links`, else -1.
  void dispatch(const int* links, int n, double t, int freed_by);
  void start(int transfer, double t, int freed_by);
  // The critical path (SimOptions::critical_path) into `sim` (and, for
  // add_boxes, s_.on_path and s_.path_bucket_device): from the end of the
  // last device's last instruction back along s_.cause.
  void trace_critical_path(Simulation& sim);
  // Nodes of s_.cause: the end of device d's instruction pc; the end of
  // the instruction before it (-1 at the first: what its start waited for);
  // a message's delivery; a collective's end (bucket_node of its collective_of).
  int instr_node(int d, int pc) const { return static_cast<int>(at(d, pc)); }
  int before_node(int d, int pc) const { return pc > 0 ? instr_node(d, pc - 1) : -1; }
  int message_node(int tr) const { return static_cast<int>(s_.first[static_cast<size_t>(l_.devices)]) + tr; }
  int bucket_node(int k) const { return message_node(static_cast<int>(l_.transfers.size())) + k; }
  // The node a message's start waits for when its links are idle: its
  // sender reaching the instruction that sends it.
  int sender_node(int tr) const {
    return before_node(l_.transfers[static_cast<size_t>(tr)].src, s_.src_instr[static_cast<size_t>(tr)]);
  }
  // With SimOptions::critical_path (else nothing): the end `node` waited for is `why`.
  void set_cause(size_t node, int why) {
    if (tracing_) s_.cause[node] = why;
  }
  void reset_causes() {
    s_.comm_free_bucket.assign(static_cast<size_t>(l_.devices), -1);
    if (!tracing_) return;
    s_.cause.assign(static_cast<size_t>(bucket_node(static_cast<int>(collective_count(l_)))), -1);
    s_.bucket_via.assign(collective_count(l_), -1);
  }
  // When node ended (ms): the clock the next end on the path counts from.
  // A started collective (allreduce_start, allgather_start) lets its device
  // go on at once: the end of that instruction is when it was reached.
  double node_end_ms(int node) const;
  bool cross_island(const Transfer& tr) const {
    return island_of(tr.src, per_island_) != island_of(tr.dst, per_island_);
  }
  using Waiting = SimState::Waiting;
  Links compute_links(const Transfer& tr) const;
  const Links& links_of(int transfer) const { return s_.links[static_cast<size_t>(transfer)]; }
  // The result: makespan and finish times, and with a timeline every
  // device's boxes and parts (add_boxes) and the messages.
  Simulation collect();
  // Device d's boxes, one per instruction shown, into `boxes`, and its
  // parts into `dev`; one step per kind of instruction (each returns
  // whether its box is shown).
  void add_boxes(int d, SimDevice& dev, std::vector<SimBox>& boxes) const;
  bool compute_box(const Instr& in, SimDevice& dev, SimBox& box) const;
  bool wait_sends_box(const Program& prog, size_t i, const InstrTimes& tm, SimDevice& dev, SimBox& box) const;
  bool post_send_box(const Program& prog, const Instr& in, SimDevice& dev, SimBox& box) const;
  bool post_recv_box(const Instr& in, SimDevice& dev, SimBox& box) const;
  bool exchange_box(const Program& prog, const Instr& in, const InstrTimes& tm, int d, SimDevice& dev,
                    SimBox& box) const;
  bool allreduce_wait_box(const Instr& in, const InstrTimes& tm, SimDevice& dev, SimBox& box) const;
  void allreduce_box(const Instr& in, const InstrTimes& tm, SimDevice& dev, SimBox& box,
                     std::vector<SimBox>& boxes) const;
  // Adds e to the queue. While an event is handled it stays at the top of
  // the heap (handling_ is set): the first event its handling pushes takes
  // its place (one sift instead of a pop and a push); run() pops it when
  // its handling pushed none.
  void push(const Event& e) {
    if (handling_) {
      handling_ = false;
      replace_top(e);
      return;
    }
    s_.events.push_back(e);
    std::push_heap(s_.events.begin(), s_.events.end(), std::greater<Event>());
  }
  // The heap's top replaced by e, sifted down to its place (the heap as
  // std::push_heap and std::pop_heap keep it with std::greater: no event
  // greater than those below it).
  void replace_top(const Event& e) {
    std::vector<Event>& h = s_.events;
    const size_t n = h.size();
    size_t i = 0;
    for (size_t c = 1; c < n; c = 2 * i + 1) {
      if (c + 1 < n && h[c] > h[c + 1]) ++c;   // the lesser child
      if (!(e > h[c])) break;
      h[i] = h[c];
      i = c;
    }
    h[i] = e;
  }
  // Whether instruction `c` touches nothing other devices see, so that a
  // device can run through it without an event: compute, post_recv, and the
  // wait for a started all-reduce or all-gather that has begun.
  bool runs_alone(const Instr& c) const {
    if (is_compute(c.kind)) return true;
    switch (c.kind) {
      case InstrKind::post_recv: return true;
      case InstrKind::allreduce_wait:
      case InstrKind::allgather_wait: return s_.bucket_end[static_cast<size_t>(collective_of(l_, c))] >= 0;
      default: return false;
    }
  }
  // How long compute instruction `c`, instruction i of device d's program,
  // takes (forward, backward: its share of the slice's time; optimizer:
  // CostModel::optimizer_ms of the values it steps; norm_sum:
  // CostModel::norm_sum_ms of the values it reads; each replaced by
  // SimOptions::replay_ms); a post_recv, its software overhead; 0 for
  // every other kind.
  // (fill_slice_ms first: the forwards' and backwards' times by slice.)
  double compute_ms(const Instr& c, size_t d, size_t i) const {
    if (c.kind == InstrKind::post_recv) return instruction_overhead_ms_;   // its messages' overhead is the exchange's
    if (!is_compute(c.kind) || !options_.price_compute) return 0.0;
    if (!options_.replay_ms.empty() && options_.replay_ms[d][i] >= 0) return options_.replay_ms[d][i];
    if (c.kind == InstrKind::optimizer) return options_.price_optimizer ? cost_.optimizer_ms(c.values) : 0.0;
    if (c.kind == InstrKind::norm_sum) return options_.price_optimizer ? cost_.norm_sum_ms(c.values) : 0.0;
    return (c.kind == InstrKind::forward ? s_.forward_ms : s_.backward_ms)[static_cast<size_t>(c.slice)];
  }
  // s_.forward_ms and s_.backward_ms: each slice's ms split by its forward
  // share (forward_share_of), once per run rather than per instruction.
  void fill_slice_ms() {
    s_.forward_ms.resize(slice_ms_.size());
    s_.backward_ms.resize(slice_ms_.size());
    for (size_t s = 0; s < slice_ms_.size(); ++s) {
      const double fwd = forward_share_of(options_, s);
      s_.forward_ms[s] = slice_ms_[s] * fwd;
      s_.backward_ms[s] = slice_ms_[s] * (1.0 - fwd);
    }
  }

  const Lowered& l_;
  const std::vector<double>& slice_ms_;
  const CostModel& cost_;
  const int per_island_;
  const SimOptions options_;
  const bool progress_in_calls_ = options_.price_communication && cost_.allreduce_progress_in_calls();
  const bool tracing_ = options_.critical_path;   // s_.cause is kept (set_cause)
  // The software overhead of one instruction that posts or completes
  // messages (a post_recv, a wait_sends), ms: 0 without communication priced.
  const double instruction_overhead_ms_ =
      options_.price_communication ? instruction_ms(cost_.overhead()) : 0.0;

  SimState& s_;
  size_t at(int d, int pc) const { return s_.first[static_cast<size_t>(d)] + static_cast<size_t>(pc); }
  // With a finite stop_after_ms: a device's finish is bounded from below
  // as the run goes (s_.compute_left, s_.sync_left), and past_bound_ is set
  // once one such bound passes stop_after_ms (the makespan will too).
  bool bounded_ = false;
  bool past_bound_ = false;
  bool handling_ = false;   // the heap's top is the event being handled (push)
  // Whether a finish no earlier than `finish_ms` passes the bound (the
  // bounds are summed in another order than the clock: a few ulps of slack).
  bool passes(double finish_ms) const { return finish_ms * (1 - 1e-12) > options_.stop_after_ms; }
  // Device d at time t reaching instruction pc: it needs time_left from
  // there, and its all-reduces not yet begun run one after another from
  // when its last one ends at the earliest.
  bool passes_bound(int d, int pc, double t) const {
    const size_t dev = static_cast<size_t>(d);
    return passes(std::max(t + s_.time_left[at(d, pc)], std::max(t, s_.comm_free[dev]) + s_.sync_left[dev]));
  }
};

Links Simulator::compute_links(const Transfer& tr) const {
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
  SPINDLE_TRY(check_replay());
  if (!options_.price_communication && !options_.timeline) return run_zero_comm();
  const int islands = island_count(l_.devices, per_island_);
  s_.pc.assign(devices, 0);
  s_.finish.assign(devices, 0.0);
  index_programs();
  s_.times.assign(s_.first[devices], InstrTimes{});
  s_.messages.assign(l_.transfers.size(), SimMessage{});
  s_.started.clear();
  s_.link_busy.assign(devices + 2 * static_cast<size_t>(islands), 0);
  s_.waiting.resize(s_.link_busy.size());
  for (auto& list : s_.waiting) list.clear();
  s_.links.clear();
  for (const Transfer& tr : l_.transfers) s_.links.push_back(compute_links(tr));
  const size_t collectives = collective_count(l_);
  s_.arrived.assign(collectives, 0);
  s_.at_bucket.resize(collectives);
  for (auto& list : s_.at_bucket) list.clear();
  s_.bucket_begin.assign(collectives, -1.0);
  s_.bucket_end.assign(collectives, -1.0);
  s_.comm_free.assign(devices, 0.0);
  s_.at_wait.resize(collectives);
  for (auto& list : s_.at_wait) list.clear();
  s_.at_wait_sends.assign(devices, -1);
  s_.time_left.clear();
  s_.sync_left.clear();
  s_.events.clear();
  s_.chain_begin.assign(devices, 0);
  s_.chain_end.assign(devices, 0);
  s_.chain_end_t.assign(devices, 0.0);
  // With a finite bound: what each device has left, for passes_bound.
  bounded_ = options_.stop_after_ms < std::numeric_limits<double>::infinity();
  if (bounded_)
    fill_time_left();
  else
    fill_instr_ms();
  SPINDLE_TRY(map_transfers());
  reset_causes();
  if (bounded_) {
    s_.sync_left.assign(devices, 0.0);
    // Every all-reduce, then (sharded state) every all-gather: gather_ms is
    // 0 without, and the sums those of the all-reduces alone.
    for (size_t k = 0; k < collectives; ++k)
      for (int m : group_of(l_, static_cast<int>(k))) s_.sync_left[static_cast<size_t>(m)] += s_.reduce_ms[k];
  }

  for (int d = 0; d < l_.devices; ++d) push({start_ms(d), kReady, d, 0});
  while (!s_.events.empty() && !past_bound_) {
    const Event e = s_.events.front();
    if (e.t > options_.stop_after_ms) return stopped_at_bound();
    handling_ = true;   // e stays at the top until an event takes its place (push)
    if (e.kind() == kDelivered)
      delivered(e.index(), e.t);
    else if (e.kind() == kPacked)
      packed(e.device(), e.index(), e.t);
    else
      ready(e.device(), e.index(), e.t);
    if (handling_) {   // nothing pushed: e leaves the queue
      handling_ = false;
      std::pop_heap(s_.events.begin(), s_.events.end(), std::greater<Event>());
      s_.events.pop_back();
    }
  }
  if (past_bound_) return stopped_at_bound();
  for (int d = 0; d < l_.devices; ++d) {
    const size_t pc = static_cast<size_t>(s_.pc[static_cast<size_t>(d)]);
    if (pc < l_.programs[static_cast<size_t>(d)].instrs.size()) return never_finishes(d, pc);
  }
  return collect();
}

Error Simulator::never_finishes(int d, size_t pc) const {
  const Instr& in = l_.programs[static_cast<size_t>(d)].instrs[pc];
  return Error{"simulate: device " + std::to_string(d) + " never finishes instruction " + std::to_string(pc) +
               (in.kind == InstrKind::exchange     ? (in.dir == Direction::copy ? std::string(" (copy exchange)")
                                                                     : " (exchange of wave " + std::to_string(in.wave) + ")")
                : in.kind == InstrKind::wait_sends ? " (wait for its sends)"
                : is_gather(in.kind)               ? " (all-gather of bucket " + std::to_string(in.bucket) + ")"
                                                   : " (all-reduce of bucket " + std::to_string(in.bucket) + ")")};
}

Status Simulator::map_transfers() {
  const size_t devices = static_cast<size_t>(l_.devices);
  s_.pending.assign(s_.first[devices], 0);
  s_.early_left.assign(devices, 0);
  s_.src_instr.assign(l_.transfers.size(), -1);
  s_.dst_instr.assign(l_.transfers.size(), -1);
  for (size_t d = 0; d < devices; ++d) {
    const Program& prog = l_.programs[d];
    for (size_t i = prog.instrs.size(); i-- > 0;) {
      const Instr& in = prog.instrs[i];
      if (in.kind != InstrKind::exchange && in.kind != InstrKind::post_send) continue;
      for (int t : prog.transfers_of(in)) {
        const Transfer& tr = l_.transfers[static_cast<size_t>(t)];
        if (tr.src == tr.dst) continue;
        // A post_send does not wait for its messages: nothing pending
        // there; the program's wait_sends waits for them.
        if (in.kind == InstrKind::exchange) ++s_.pending[s_.first[d] + i];
        else ++s_.early_left[d];
        (tr.src == static_cast<int>(d) ? s_.src_instr : s_.dst_instr)[static_cast<size_t>(t)] = static_cast<int>(i);
      }
    }
  }
  for (size_t t = 0; t < l_.transfers.size(); ++t) {
    const Transfer& tr = l_.transfers[t];
    if (tr.src != tr.dst && (s_.src_instr[t] < 0 || s_.dst_instr[t] < 0))
      return Error{"simulate: transfer " + std::to_string(t) + " from device " + std::to_string(tr.src) + " to " +
                   std::to_string(tr.dst) + " is missing from the exchanges and post_sends of either program"};
  }
  return {};
}

// With nothing but compute taking time, the event simulation reduces to a
// longest path: a message is delivered the moment its sender packs it
// (packing and the wire cost 0, and a link a message holds for 0 ms is free
// again at that same moment), an all-reduce ends the moment the last member
// of its group reaches it (it takes 0 ms, and so does every earlier one on
// its members; an all-gather likewise), and a wait for sends posted early
// never waits. So a device waits only at an exchange, until the senders of
// what it receives have reached the instructions that send it, and at a
// blocking all-reduce or all-gather or the wait for a started one
// (allreduce_wait, allgather_wait), until the last member has reached the
// collective; its clock then becomes the latest of those times and its
// own. Those times do not depend on the order in which devices are
// advanced: each device runs until it must wait for one that has not got
// there yet, and whoever gets there wakes it. The same sums (a clock plus
// each compute instruction's ms, in program order) and maxima as the
// events would take: the same makespan to the bit (test_sim checks it
// against the events on every shipped workload and on random plans).
Result<Simulation> Simulator::run_zero_comm() {
  const size_t devices = static_cast<size_t>(l_.devices);
  index_programs();
  fill_instr_ms();
  SPINDLE_TRY(map_transfers());
  reset_causes();
  s_.pc.assign(devices, 0);
  s_.finish.assign(devices, 0.0);
  s_.clock.assign(devices, 0.0);
  for (size_t d = 0; d < devices; ++d) s_.clock[d] = start_ms(static_cast<int>(d));
  s_.parked.assign(devices, 0);
  s_.sent_at.assign(l_.transfers.size(), -1.0);
  const size_t collectives = collective_count(l_);
  s_.arrived.assign(collectives, 0);
  s_.bucket_begin.assign(collectives, 0.0);   // the latest arrival so far
  s_.bucket_end.assign(collectives, -1.0);
  s_.at_wait.resize(collectives);
  for (auto& list : s_.at_wait) list.clear();
  s_.runnable.clear();
  for (int d = l_.devices; d-- > 0;) s_.runnable.push_back(d);
  while (!s_.runnable.empty()) {
    const int d = s_.runnable.back();
    s_.runnable.pop_back();
    zero_comm_advance(d);
  }
  for (int d = 0; d < l_.devices; ++d) {
    const size_t pc = static_cast<size_t>(s_.pc[static_cast<size_t>(d)]);
    if (pc < l_.programs[static_cast<size_t>(d)].instrs.size()) return never_finishes(d, pc);
  }
  Simulation sim = collect();
  if (sim.iteration_ms > options_.stop_after_ms) return stopped_at_bound();
  return sim;
}

// Device d goes on from its pc until it must wait or its program ends.
void Simulator::zero_comm_advance(int d) {
  const size_t dev = static_cast<size_t>(d);
  const Program& prog = l_.programs[dev];
  const int end = static_cast<int>(prog.instrs.size());
  double t = s_.clock[dev];
  for (int pc = s_.pc[dev]; pc < end; ++pc) {
    const Instr& in = prog.instrs[static_cast<size_t>(pc)];
    int cause = before_node(d, pc);   // what its end waited for (set_cause below)
    switch (in.kind) {
      case InstrKind::exchange:
      case InstrKind::post_send: {
        // Its sends leave when it gets here (`reached`); it goes on once
        // the last of its receives has left its sender.
        const double reached = t;
        int missing = 0;
        for (int tr : prog.transfers_of(in)) {
          const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
          if (x.src == x.dst) continue;
          if (x.src == d) {   // delivered now; its receiver may be waiting for it
            s_.sent_at[static_cast<size_t>(tr)] = reached;
            const size_t r = static_cast<size_t>(x.dst);
            const int rpc = s_.dst_instr[static_cast<size_t>(tr)];
            if (s_.parked[r] && s_.pc[r] == rpc) {
              if (reached > s_.clock[r]) set_cause(at(x.dst, rpc), before_node(d, pc));
              s_.clock[r] = std::max(s_.clock[r], reached);
              if (--s_.pending[at(x.dst, rpc)] == 0) zero_comm_wake(x.dst, rpc, reached);
            }
          } else if (s_.sent_at[static_cast<size_t>(tr)] >= 0) {
            if (s_.sent_at[static_cast<size_t>(tr)] > t) cause = sender_node(tr);
            t = std::max(t, s_.sent_at[static_cast<size_t>(tr)]);
          } else {
            ++missing;
          }
        }
        if (missing > 0) {   // woken by the last of those senders (above)
          s_.pending[at(d, pc)] = missing;
          set_cause(at(d, pc), cause);
          return zero_comm_park(d, pc, t);
        }
        break;
      }
      case InstrKind::allreduce_start:
      case InstrKind::allgather_start: zero_comm_arrive(collective_of(l_, in), t, cause); break;
      case InstrKind::allreduce:
      case InstrKind::allgather:
      case InstrKind::grad_norm:
      case InstrKind::allreduce_wait:
      case InstrKind::allgather_wait: {
        const int k = collective_of(l_, in);
        const size_t c = static_cast<size_t>(k);
        if (!waits_collective(in.kind)) zero_comm_arrive(k, t, cause);
        if (s_.bucket_end[c] < 0) {   // woken by the group's last member (zero_comm_arrive)
          s_.at_wait[c].push_back({d, pc});
          set_cause(at(d, pc), cause);
          return zero_comm_park(d, pc, t);
        }
        if (s_.bucket_end[c] > t) cause = bucket_node(k);
        t = std::max(t, s_.bucket_end[c]);
        break;
      }
      case InstrKind::wait_sends:
      case InstrKind::post_recv: break;
      default: t += s_.instr_ms[at(d, pc)];
    }
    set_cause(at(d, pc), cause);
  }
  s_.clock[dev] = t;
  s_.pc[dev] = end;
  s_.finish[dev] = t;
}

// A device reaches collective c (a bucket's allreduce or allreduce_start,
// or its allgather or allgather_start) at t; the group's last member ends
// the collective and wakes those waiting for it (at a blocking allreduce or
// allgather, or an allreduce_wait or allgather_wait).
void Simulator::zero_comm_arrive(int c, double t, int node) {
  const size_t k = static_cast<size_t>(c);
  if (s_.arrived[k] == 0 || t > s_.bucket_begin[k]) set_cause(static_cast<size_t>(bucket_node(c)), node);
  s_.bucket_begin[k] = std::max(s_.bucket_begin[k], t);
  if (++s_.arrived[k] < static_cast<int>(group_of(l_, c).size())) return;
  s_.bucket_end[k] = s_.bucket_begin[k] + s_.reduce_ms[k];
  for (auto [m, mpc] : s_.at_wait[k]) {
    if (s_.bucket_end[k] > s_.clock[static_cast<size_t>(m)]) set_cause(at(m, mpc), bucket_node(c));
    zero_comm_wake(m, mpc, s_.bucket_end[k]);
  }
  s_.at_wait[k].clear();
}

void Simulator::zero_comm_park(int d, int pc, double t) {
  const size_t dev = static_cast<size_t>(d);
  s_.clock[dev] = t;
  s_.pc[dev] = pc;
  s_.parked[dev] = 1;
}

void Simulator::zero_comm_wake(int d, int pc, double t) {
  const size_t dev = static_cast<size_t>(d);
  s_.clock[dev] = std::max(s_.clock[dev], t);
  s_.parked[dev] = 0;
  s_.pc[dev] = pc + 1;
  s_.runnable.push_back(d);
}

void Simulator::index_programs() {
  const size_t devices = static_cast<size_t>(l_.devices);
  s_.first.assign(devices + 1, 0);
  for (size_t d = 0; d < devices; ++d) s_.first[d + 1] = s_.first[d] + l_.programs[d].instrs.size();
  s_.reduce_ms.clear();
  for (size_t b = 0; b < l_.buckets.size(); ++b) s_.reduce_ms.push_back(bucket_ms(l_, b, cost_, options_));
  for (size_t b = 0; b < l_.buckets.size(); ++b) s_.reduce_ms.push_back(gather_ms(l_, b, cost_, options_));
  if (l_.grad_norm) s_.reduce_ms.push_back(norm_ms(l_, cost_, options_));
}

Status Simulator::check_replay() const {
  const std::vector<std::vector<double>>& replay = options_.replay_ms;
  const std::vector<double>& start = options_.replay_start_ms;
  if (!start.empty()) {
    if (start.size() != l_.programs.size())
      return Error{"simulate: replay start times for " + std::to_string(start.size()) + " devices, the programs have " +
                   std::to_string(l_.programs.size())};
    for (size_t d = 0; d < start.size(); ++d)
      if (!(start[d] >= 0) || std::isinf(start[d]))
        return Error{"simulate: device " + std::to_string(d) + ": replay start time is not a finite figure >= 0"};
  }
  if (replay.empty()) return {};
  if (replay.size() != l_.programs.size())
    return Error{"simulate: replay times for " + std::to_string(replay.size()) + " devices, the programs have " +
                 std::to_string(l_.programs.size())};
  for (size_t d = 0; d < replay.size(); ++d) {
    const std::vector<Instr>& instrs = l_.programs[d].instrs;
    if (replay[d].size() != instrs.size())
      return Error{"simulate: device " + std::to_string(d) + ": replay times for " + std::to_string(replay[d].size()) +
                   " instructions, its program has " + std::to_string(instrs.size())};
    for (size_t i = 0; i < instrs.size(); ++i) {
      if (replay[d][i] >= 0 && !is_compute(instrs[i].kind))
        return Error{"simulate: device " + std::to_string(d) + ": instruction " + std::to_string(i) +
                     " is no forward, backward, optimizer step or norm_sum but has a replay time"};
      if (std::isnan(replay[d][i]) || std::isinf(replay[d][i]))
        return Error{"simulate: device " + std::to_string(d) + ": instruction " + std::to_string(i) +
                     ": replay time is not finite"};
    }
  }
  return {};
}

void Simulator::fill_instr_ms() {
  fill_slice_ms();
  s_.instr_ms.resize(s_.first[static_cast<size_t>(l_.devices)]);
  for (size_t d = 0; d < static_cast<size_t>(l_.devices); ++d) {
    const std::vector<Instr>& instrs = l_.programs[d].instrs;
    for (size_t i = 0; i < instrs.size(); ++i) s_.instr_ms[s_.first[d] + i] = compute_ms(instrs[i], d, i);
  }
}

// Backwards over each program: the least time from reaching instruction i
// to the end (`left`). Compute takes its time and a blocking all-reduce or
// all-gather its collective's; a collective started at i (allreduce_start,
// allgather_start) begins no sooner than i is reached and its wait
// (allreduce_wait, allgather_wait) is followed by what is left after it;
// and the collectives started from i on (`started`: their times summed)
// run one after another on the device, the last followed at least by the
// least that is left after any of their waits (`least_tail`). With sharded
// optimizer state the blocking all-gathers join them: every collective the
// device reaches from i on (`collective`: started ones, blocking
// all-reduces and all-gathers) runs one after another on it, none before i
// is reached, the last followed at least by the least left after any of
// them ends on the device (`least_after`: after its wait, or after the
// blocking instruction). Without sharded state that term is the started
// all-reduces' (overlap) or within the sum of the blocking ones (no
// overlap), and is left out: the same figures to the bit as before
// all-gathers. On the way, s_.instr_ms.
void Simulator::fill_time_left() {
  fill_slice_ms();
  s_.time_left.resize(s_.first[static_cast<size_t>(l_.devices)]);
  s_.instr_ms.resize(s_.first[static_cast<size_t>(l_.devices)]);
  s_.after_wait.assign(collective_count(l_), 0.0);
  const bool gathers = l_.sharded_state;
  for (size_t d = 0; d < static_cast<size_t>(l_.devices); ++d) {
    const Program& prog = l_.programs[d];
    double left = 0, started = 0, least_tail = std::numeric_limits<double>::infinity();
    double collective = 0, least_after = std::numeric_limits<double>::infinity();
    for (size_t i = prog.instrs.size(); i-- > 0;) {
      const Instr& in = prog.instrs[i];
      const double own_ms = s_.instr_ms[s_.first[d] + i] = compute_ms(in, d, i);
      switch (in.kind) {
        case InstrKind::allreduce_wait:
        case InstrKind::allgather_wait: s_.after_wait[static_cast<size_t>(collective_of(l_, in))] = left; break;
        case InstrKind::allreduce_start:
        case InstrKind::allgather_start: {
          const auto k = static_cast<size_t>(collective_of(l_, in));
          const double ms = s_.reduce_ms[k];
          started += ms;
          least_tail = std::min(least_tail, s_.after_wait[k]);
          left = std::max({left, ms + s_.after_wait[k], started + least_tail});
          if (gathers) {
            collective += ms;
            least_after = std::min(least_after, s_.after_wait[k]);
            left = std::max(left, collective + least_after);
          }
          s_.after_wait[k] = 0;   // another device's start never sees this device's wait
          break;
        }
        case InstrKind::allreduce:
        case InstrKind::allgather:
        case InstrKind::grad_norm: {
          const double ms = s_.reduce_ms[static_cast<size_t>(collective_of(l_, in))];
          if (gathers) {
            collective += ms;
            least_after = std::min(least_after, left);
          }
          left += ms;
          if (gathers) left = std::max(left, collective + least_after);
          break;
        }
        default: left += own_ms;
      }
      s_.time_left[s_.first[d] + i] = left;
    }
  }
}

double Simulator::lower_bound() {
  // Programs or slice times that do not match: simulate() refuses them; 0 bounds nothing.
  if (slice_ms_.size() != l_.slices.size() || l_.programs.size() != static_cast<size_t>(l_.devices)) return 0.0;
  index_programs();
  fill_time_left();
  double bound = 0;
  for (size_t d = 0; d < static_cast<size_t>(l_.devices); ++d)
    if (s_.first[d + 1] > s_.first[d]) bound = std::max(bound, s_.time_left[s_.first[d]]);
  // Summed in another order than the simulation's clock: a few ulps below.
  return bound * (1 - 1e-12);
}

// Compute instructions touch nothing shared, nor does the wait for a
// started all-reduce or all-gather that has begun (its end is known): the
// device runs through them here, and the next event is the one for the
// instruction after the last of them (the same event, at the same time,
// that running them one event at a time would push).
void Simulator::ready(int d, int pc, double t) {
  const Program& prog = l_.programs[static_cast<size_t>(d)];
  const int end = static_cast<int>(prog.instrs.size());
  s_.pc[static_cast<size_t>(d)] = pc;
  if (pc >= end) {
    s_.finish[static_cast<size_t>(d)] = t;
    return;
  }
  const Instr& in = prog.instrs[static_cast<size_t>(pc)];
  if (bounded_ && passes_bound(d, pc, t)) {
    past_bound_ = true;
    return;
  }
  InstrTimes& times = s_.times[at(d, pc)];
  times.reached = times.began = t;
  set_cause(at(d, pc), before_node(d, pc));
  s_.chain_begin[static_cast<size_t>(d)] = s_.chain_end[static_cast<size_t>(d)] = pc;
  s_.chain_end_t[static_cast<size_t>(d)] = t;
  if (in.kind == InstrKind::exchange || in.kind == InstrKind::post_send) return enter_exchange(d, pc, t);
  if (blocking_collective(in.kind)) return enter_allreduce(d, pc, t);
  if (waits_collective(in.kind) && s_.bucket_end[static_cast<size_t>(collective_of(l_, in))] < 0) {
    s_.at_wait[static_cast<size_t>(collective_of(l_, in))].push_back({d, pc});   // until the collective ends
    return;
  }
  if (in.kind == InstrKind::wait_sends) return enter_wait_sends(d, pc, t);
  if (starts_collective(in.kind)) {
    enter_allreduce(d, pc, t);   // the device goes on at once
    return ready(d, pc + 1, t);
  }
  for (;;) {
    const Instr& c = prog.instrs[static_cast<size_t>(pc)];
    InstrTimes& tm = s_.times[at(d, pc)];
    tm.reached = tm.began = t;
    if (waits_collective(c.kind)) {   // a collective that has begun: its end is known
      const int k = collective_of(l_, c);
      const double end_ms = s_.bucket_end[static_cast<size_t>(k)];
      set_cause(at(d, pc), end_ms > t ? bucket_node(k) : before_node(d, pc));
      t = std::max(t, end_ms);
    } else {
      set_cause(at(d, pc), before_node(d, pc));
      t += s_.instr_ms[at(d, pc)];
    }
    tm.ended = t;
    ++pc;
    if (pc >= end || !runs_alone(prog.instrs[static_cast<size_t>(pc)])) break;
  }
  s_.chain_end[static_cast<size_t>(d)] = pc;
  s_.chain_end_t[static_cast<size_t>(d)] = t;
  push({t, kReady, d, pc});
}

// The first time at or after t at which device d is inside an MPI call or
// polls (spindle-run polls after every compute instruction, and its
// exchanges and waits are MPI calls): t when it is blocked or between
// instructions then, else the end of the compute instruction it runs at t.
double Simulator::next_poll(int d, double t, int* instr) const {
  const size_t dev = static_cast<size_t>(d);
  *instr = -1;
  if (s_.chain_end_t[dev] <= t) return t;
  const Program& prog = l_.programs[dev];
  for (int i = s_.chain_begin[dev]; i < s_.chain_end[dev]; ++i) {
    const InstrTimes& tm = s_.times[at(d, i)];
    if (tm.began <= t && t < tm.ended) {
      const bool compute = is_compute(prog.instrs[static_cast<size_t>(i)].kind);
      if (compute) *instr = i;
      return compute ? tm.ended : t;
    }
  }
  return t;
}

// Software overhead (rules/links.h exchange_overhead_ms): the device first
// packs (fixed + per-message + sent bytes), then its messages leave; once
// its last message is delivered it unpacks the received bytes and, in a
// backward exchange, adds the pieces it got (local ones too) that
// Transfer::adds says it adds into its producers' output gradients
// (accumulate_ms), then goes on.
// A post_send is the first half alone: the device goes on once it has
// packed, its messages move on their own (and an exchange then has only
// the messages it receives).
void Simulator::enter_exchange(int d, int pc, double t) {
  const Program& prog = l_.programs[static_cast<size_t>(d)];
  const Instr& in = prog.instrs[static_cast<size_t>(pc)];
  int messages = 0;
  double sent = 0, received = 0, accumulated = 0;
  for (int tr : prog.transfers_of(in)) {
    const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
    if (x.dst == d && x.adds) accumulated += static_cast<double>(x.values * kWireBytesPerValue);
    if (x.src == x.dst) continue;
    ++messages;
    (x.src == d ? sent : received) += static_cast<double>(x.bytes);
  }
  const CommOverhead o = options_.price_communication ? cost_.overhead() : CommOverhead{};
  const double pack = exchange_overhead_ms(o, messages, sent);
  const bool adds = in.kind == InstrKind::exchange && in.dir == Direction::backward;
  s_.times[at(d, pc)].unpack_ms =
      (messages > 0 ? pack_ms(o, received) : 0.0) + (adds ? accumulate_ms(o, accumulated) : 0.0);
  if (pack > 0)
    push({t + pack, kPacked, d, pc});
  else
    packed(d, pc, t);
}

void Simulator::packed(int d, int pc, double t) {
  s_.times[at(d, pc)].packed = t;
  const Program& prog = l_.programs[static_cast<size_t>(d)];
  for (int tr : prog.transfers_of(prog.instrs[static_cast<size_t>(pc)])) {
    const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
    if (x.src == d && x.dst != d) {
      s_.messages[static_cast<size_t>(tr)].transfer = tr;
      s_.messages[static_cast<size_t>(tr)].ready_ms = t;
      const Links& links = links_of(tr);
      for (int k : links) {
        std::vector<Waiting>& list = s_.waiting[static_cast<size_t>(k)];
        const Waiting key{t, d, tr};
        list.insert(std::upper_bound(list.begin(), list.end(), key), key);
      }
      dispatch(links.begin(), links.n, t, -1);
    }
  }
  if (prog.instrs[static_cast<size_t>(pc)].kind == InstrKind::post_send) {
    s_.times[at(d, pc)].ended = t;
    push({t, kReady, d, pc + 1});
  } else if (s_.pending[at(d, pc)] == 0) {
    end_exchange(d, pc, t);
  }
}

// Every message of the exchange (or every early send, for a wait_sends)
// is delivered and the device has packed: it unpacks, then goes on.
void Simulator::end_exchange(int d, int pc, double t, int why) {
  if (why >= 0) set_cause(at(d, pc), why);
  InstrTimes& times = s_.times[at(d, pc)];
  times.ended = t + times.unpack_ms;
  push({times.ended, kReady, d, pc + 1});
}

// A device reaches a bucket's all-reduce or all-gather (collective_of):
// the blocking one (allreduce, allgather) or its start (allreduce_start,
// allgather_start). Members at a blocking one go on when it ends; those
// that started it went on already, and those blocked at its wait
// (allreduce_wait, allgather_wait) go on when it ends. A device runs one
// collective at a time (all-reduces and all-gathers share its links): a
// collective begins once its whole group has reached it and every member
// has ended the collectives that began before, served in the order their
// groups completed. No head-of-line blocking across groups: each group's
// communicator progresses on its own (MPI_Iallreduce on its own
// communicator; NCCL, a stream per group), so one whose group is complete
// need not wait for an earlier-started one whose group is not.
void Simulator::enter_allreduce(int d, int pc, double t) {
  const int b = collective_of(l_, l_.programs[static_cast<size_t>(d)].instrs[static_cast<size_t>(pc)]);
  const std::vector<int>& group = group_of(l_, b);
  s_.at_bucket[static_cast<size_t>(b)].push_back({d, pc});
  if (++s_.arrived[static_cast<size_t>(b)] < static_cast<int>(group.size())) return;
  double begin = t;
  int why = before_node(d, pc);   // what the end waits for: the last member's arrival, ...
  for (int m : group) {
    const size_t dev = static_cast<size_t>(m);
    if (s_.comm_free[dev] > begin) {   // a member's collective before
      why = bucket_node(s_.comm_free_bucket[dev]);
      if (tracing_) s_.bucket_via[static_cast<size_t>(b)] = m;
    }
    begin = std::max(begin, s_.comm_free[dev]);
  }
  // MPI moves a started collective only inside MPI calls
  // (CostModel::allreduce_progress_in_calls): it begins once every member
  // has polled after the group completed.
  if (progress_in_calls_)
    for (int m : group) {
      int instr = -1;
      const double poll = next_poll(m, t, &instr);
      if (poll > begin) why = instr_node(m, instr);   // ... or a member's compute before its poll
      begin = std::max(begin, poll);
    }
  set_cause(static_cast<size_t>(bucket_node(b)), why);
  const double ms = s_.reduce_ms[static_cast<size_t>(b)];
  const double end = begin + ms;
  for (int m : group) {
    s_.comm_free[static_cast<size_t>(m)] = end;
    s_.comm_free_bucket[static_cast<size_t>(m)] = b;
    if (!bounded_) continue;
    s_.sync_left[static_cast<size_t>(m)] -= ms;
    past_bound_ = past_bound_ || passes(end + s_.sync_left[static_cast<size_t>(m)]);
  }
  s_.bucket_begin[static_cast<size_t>(b)] = begin;
  s_.bucket_end[static_cast<size_t>(b)] = end;
  for (auto [m, mpc] : s_.at_bucket[static_cast<size_t>(b)]) {
    InstrTimes& times = s_.times[at(m, mpc)];
    times.began = begin;
    times.ended = end;
    if (blocking_collective(l_.programs[static_cast<size_t>(m)].instrs[static_cast<size_t>(mpc)].kind)) {
      set_cause(at(m, mpc), bucket_node(b));
      push({end, kReady, m, mpc + 1});
    }
  }
  for (auto [m, wpc] : s_.at_wait[static_cast<size_t>(b)]) {
    set_cause(at(m, wpc), bucket_node(b));
    s_.times[at(m, wpc)].ended = end;
    push({end, kReady, m, wpc + 1});
  }
}

// The wait for every message of the device's post_sends: once all are
// delivered (at once if they are), the device completes them
// (CommOverhead::instruction_us, kept in unpack_ms), then goes on.
void Simulator::enter_wait_sends(int d, int pc, double t) {
  s_.times[at(d, pc)].unpack_ms = instruction_overhead_ms_;
  if (s_.early_left[static_cast<size_t>(d)] > 0) {
    s_.at_wait_sends[static_cast<size_t>(d)] = pc;
    return;
  }
  end_exchange(d, pc, t);
}

void Simulator::dispatch(const int* links, int n, double t, int freed_by) {
  // Walk the waiting lists of the given links (one or two) merged in order
  // of readiness, a message on both lists once. pos[i]: the next entry of
  // list i not yet looked at.
  std::vector<Waiting>* list[2] = {nullptr, nullptr};
  size_t pos[2] = {0, 0};
  for (int i = 0; i < n; ++i) list[i] = &s_.waiting[static_cast<size_t>(links[i])];
  auto all_busy = [&] {
    for (int i = 0; i < n; ++i)
      if (!s_.link_busy[static_cast<size_t>(links[i])]) return false;
    return true;
  };
  while (!all_busy()) {
    int pick = -1;
    for (int i = 0; i < n; ++i)
      if (!s_.link_busy[static_cast<size_t>(links[i])] && pos[i] < list[i]->size() &&
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
    if (std::any_of(need.begin(), need.end(), [&](int k) { return s_.link_busy[static_cast<size_t>(k)] != 0; }))
      continue;
    // Off every list it waits on: those walked here hold it just before pos.
    for (int i = 0; i < n; ++i)
      if (passed[i]) list[i]->erase(list[i]->begin() + static_cast<std::ptrdiff_t>(--pos[i]));
    for (int k : need) {
      if (std::find(links, links + n, k) != links + n) continue;
      std::vector<Waiting>& other = s_.waiting[static_cast<size_t>(k)];
      other.erase(std::lower_bound(other.begin(), other.end(), key));
    }
    start(tr, t, freed_by);
  }
}

void Simulator::start(int tr, double t, int freed_by) {
  const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
  SimMessage& m = s_.messages[static_cast<size_t>(tr)];
  if (tracing_)
    set_cause(static_cast<size_t>(message_node(tr)), m.ready_ms < t && freed_by >= 0 ? freed_by : sender_node(tr));
  for (int k : links_of(tr)) s_.link_busy[static_cast<size_t>(k)] = 1;
  const double ms = options_.price_communication ? cost_.p2p_ms(static_cast<double>(x.bytes), cross_island(x)) : 0.0;
  m.start_ms = t;
  m.end_ms = t + ms;
  s_.started.push_back(tr);
  push({t + ms, kDelivered, x.dst, tr});
}

void Simulator::delivered(int tr, double t) {
  const Transfer& x = l_.transfers[static_cast<size_t>(tr)];
  const Links& links = links_of(tr);
  for (int k : links) s_.link_busy[static_cast<size_t>(k)] = 0;
  for (auto [d, pc] : {std::pair{x.src, s_.src_instr[static_cast<size_t>(tr)]},
                       std::pair{x.dst, s_.dst_instr[static_cast<size_t>(tr)]}}) {
    if (l_.programs[static_cast<size_t>(d)].instrs[static_cast<size_t>(pc)].kind != InstrKind::exchange) {
      // Posted early: its sender went on; its wait_sends may be waiting.
      if (--s_.early_left[static_cast<size_t>(d)] == 0 && s_.at_wait_sends[static_cast<size_t>(d)] >= 0) {
        end_exchange(d, std::exchange(s_.at_wait_sends[static_cast<size_t>(d)], -1), t, message_node(tr));
      }
      continue;
    }
    int& left = s_.pending[at(d, pc)];
    // The device is blocked in this exchange, has packed, and it is now complete.
    if (--left == 0 && s_.pc[static_cast<size_t>(d)] == pc &&
        s_.times[at(d, pc)].packed >= 0)
      end_exchange(d, pc, t, message_node(tr));
  }
  dispatch(links.begin(), links.n, t, message_node(tr));
}

Simulation Simulator::collect() {
  Simulation sim;
  sim.devices.resize(static_cast<size_t>(l_.devices));
  for (int d = 0; d < l_.devices; ++d) {
    SimDevice& dev = sim.devices[static_cast<size_t>(d)];
    dev.finish_ms = s_.finish[static_cast<size_t>(d)];
    sim.iteration_ms = std::max(sim.iteration_ms, dev.finish_ms);
  }
  if (options_.critical_path) trace_critical_path(sim);
  if (!options_.timeline) return sim;
  for (int d = 0; d < l_.devices; ++d) add_boxes(d, sim.devices[static_cast<size_t>(d)], sim.boxes);
  for (SimDevice& dev : sim.devices) dev.idle_ms = sim.iteration_ms - dev.busy_ms();
  for (int t : s_.started) sim.messages.push_back(s_.messages[static_cast<size_t>(t)]);
  return sim;
}

double Simulator::node_end_ms(int node) const {
  const int instrs = message_node(0), messages = static_cast<int>(l_.transfers.size());
  if (node >= instrs + messages) return s_.bucket_end[static_cast<size_t>(node - instrs - messages)];
  if (node >= instrs) return s_.messages[static_cast<size_t>(node - instrs)].end_ms;
  const InstrTimes& tm = s_.times[static_cast<size_t>(node)];
  const auto d = static_cast<size_t>(
      std::upper_bound(s_.first.begin(), s_.first.end(), static_cast<size_t>(node)) - s_.first.begin() - 1);
  const InstrKind k = l_.programs[d].instrs[static_cast<size_t>(node) - s_.first[d]].kind;
  return starts_collective(k) ? tm.reached : tm.ended;
}

void Simulator::trace_critical_path(Simulation& sim) {
  SimPath& path = sim.critical;
  path = SimPath{};
  sim.critical_slices.assign(l_.slices.size(), 0);
  const bool events = options_.price_communication || options_.timeline;   // run() ran events, not one pass
  if (events) {
    s_.on_path.assign(s_.times.size(), 0);
    s_.path_bucket_device.assign(collective_count(l_), -1);
  }
  for (int d = 0; d < l_.devices; ++d)
    if (!l_.programs[static_cast<size_t>(d)].instrs.empty() &&
        (path.device < 0 || s_.finish[static_cast<size_t>(d)] > s_.finish[static_cast<size_t>(path.device)]))
      path.device = d;
  if (path.device < 0) return;
  const int instrs = message_node(0);
  const int messages = static_cast<int>(l_.transfers.size());
  int node = instr_node(path.device, static_cast<int>(l_.programs[static_cast<size_t>(path.device)].instrs.size()) - 1);
  int shown_on = path.device;   // the device of the end that waited for `node`
  // Every cause ends no later than the end that waited for it, and was
  // recorded before it: the walk ends; the guard only bounds it.
  for (size_t steps = s_.cause.size(); node >= 0 && steps-- > 0; node = s_.cause[static_cast<size_t>(node)]) {
    const int cause = s_.cause[static_cast<size_t>(node)];
    // The time from the cause's end to this node's end: this node's part.
    const double part = events ? node_end_ms(node) - (cause >= 0 ? node_end_ms(cause) : 0.0) : 0.0;
    if (node >= instrs + messages) {   // a collective, shown on the device that waited for it
      const int b = node - instrs - messages;
      path.sync_ms += part;
      if (events) s_.path_bucket_device[static_cast<size_t>(b)] = shown_on;
      if (s_.bucket_via[static_cast<size_t>(b)] >= 0) shown_on = s_.bucket_via[static_cast<size_t>(b)];
      continue;
    }
    if (node >= instrs) {   // a message (and its packing): the slice it feeds
      const Transfer& x = l_.transfers[static_cast<size_t>(node - instrs)];
      path.transfer_ms += part;
      sim.critical_slices[static_cast<size_t>(x.slice)] = 1;
      shown_on = x.src;
      continue;
    }
    const auto d = static_cast<size_t>(
        std::upper_bound(s_.first.begin(), s_.first.end(), static_cast<size_t>(node)) - s_.first.begin() - 1);
    shown_on = static_cast<int>(d);
    if (events) s_.on_path[static_cast<size_t>(node)] = 1;
    const Instr& in = l_.programs[d].instrs[static_cast<size_t>(node) - s_.first[d]];
    switch (in.kind) {
      case InstrKind::forward:
      case InstrKind::backward:
        sim.critical_slices[static_cast<size_t>(in.slice)] = 1;
        path.compute_ms += part;
        break;
      case InstrKind::norm_sum: path.compute_ms += part; break;
      case InstrKind::optimizer:
        path.compute_ms += part;
        if (in.bucket >= 0 || in.values == 0) break;
        // It steps the device's own shards (no all-reduce): every slice on it.
        for (size_t i = 0; i < l_.slices.size(); ++i)
          if (std::binary_search(l_.slices[i].devices.begin(), l_.slices[i].devices.end(), static_cast<int>(d)))
            sim.critical_slices[i] = 1;
        break;
      case InstrKind::allreduce:
      case InstrKind::allreduce_start:
      case InstrKind::allreduce_wait:
      case InstrKind::allgather:
      case InstrKind::allgather_start:
      case InstrKind::allgather_wait:
      case InstrKind::grad_norm: path.sync_ms += part; break;
      default: path.transfer_ms += part;   // exchanges, posts, waits for sends: packing and unpacking
    }
  }
  if (!events) path.compute_ms = sim.iteration_ms;   // one pass prices compute alone
}

void Simulator::add_boxes(int d, SimDevice& dev, std::vector<SimBox>& boxes) const {
  const Program& prog = l_.programs[static_cast<size_t>(d)];
  for (size_t i = 0; i < prog.instrs.size(); ++i) {
    const Instr& in = prog.instrs[i];
    const InstrTimes& tm = s_.times[s_.first[static_cast<size_t>(d)] + i];
    SimBox box;
    box.device = d;
    box.instr = static_cast<int>(i);
    box.start_ms = tm.began;
    box.dur_ms = tm.ended - tm.began;
    bool shown = true;
    switch (in.kind) {
      case InstrKind::forward:
      case InstrKind::backward:
      case InstrKind::optimizer:
      case InstrKind::norm_sum: shown = compute_box(in, dev, box); break;
      case InstrKind::post_recv: shown = post_recv_box(in, dev, box); break;
      case InstrKind::wait_sends: shown = wait_sends_box(prog, i, tm, dev, box); break;
      case InstrKind::post_send: shown = post_send_box(prog, in, dev, box); break;
      case InstrKind::exchange: shown = exchange_box(prog, in, tm, d, dev, box); break;
      case InstrKind::allreduce_wait:
      case InstrKind::allgather_wait: shown = allreduce_wait_box(in, tm, dev, box); break;
      case InstrKind::allreduce_start:
      case InstrKind::allreduce:
      case InstrKind::allgather:
      case InstrKind::allgather_start:
      case InstrKind::grad_norm: allreduce_box(in, tm, dev, box, boxes); break;
    }
    if (!shown) continue;
    if (options_.critical_path) {
      // The collective's box (not a wait's) on the device it is shown on there.
      const bool collective = blocking_collective(in.kind) || starts_collective(in.kind);
      const bool reduced_on_path = in.bucket >= 0 && collective &&
                                   s_.path_bucket_device[static_cast<size_t>(collective_of(l_, in))] == d;
      box.critical = s_.on_path[s_.first[static_cast<size_t>(d)] + i] != 0 || reduced_on_path;
    }
    boxes.push_back(std::move(box));
  }
}

bool Simulator::compute_box(const Instr& in, SimDevice& dev, SimBox& box) const {
  dev.compute_ms += box.dur_ms;
  if (in.kind == InstrKind::optimizer || in.kind == InstrKind::norm_sum) {
    box.cat = "optimizer";
    box.name = in.kind == InstrKind::optimizer ? "optimizer" : "gradient norm sum";
    return box.dur_ms > 0;
  }
  const bool fwd = in.kind == InstrKind::forward;
  box.cat = fwd ? "forward" : "backward";
  box.wave = in.wave;
  box.slice = in.slice;
  box.name = "slice " + std::to_string(in.slice) + (fwd ? " fwd" : " bwd");
  return true;
}

// Blocked until its early sends are delivered: transfer while one of them
// moves or the device completes them, else wait.
bool Simulator::wait_sends_box(const Program& prog, size_t i, const InstrTimes& tm, SimDevice& dev,
                               SimBox& box) const {
  std::vector<std::pair<double, double>> spans;
  for (size_t j = 0; j < i; ++j) {
    if (prog.instrs[j].kind != InstrKind::post_send) continue;
    for (int t : prog.transfers_of(prog.instrs[j])) {
      const SimMessage& m = s_.messages[static_cast<size_t>(t)];
      spans.push_back({m.start_ms, m.end_ms});
    }
  }
  spans.push_back({tm.ended - tm.unpack_ms, tm.ended});
  const double moving = covered_ms(std::move(spans), tm.reached, tm.ended);
  dev.transfer_ms += moving;
  dev.wait_ms += box.dur_ms - moving;
  if (box.dur_ms <= 0) return false;
  box.track = SimTrack::communication;
  box.cat = "wait";
  box.name = "wait for sends posted early";
  return true;
}

// Posting receives is the device's work (CommOverhead: 0 ms without
// overhead figures, then not shown).
bool Simulator::post_recv_box(const Instr& in, SimDevice& dev, SimBox& box) const {
  dev.transfer_ms += box.dur_ms;
  if (box.dur_ms <= 0) return false;
  box.track = SimTrack::communication;
  box.cat = "recv";
  box.wave = in.wave;
  box.name = std::string("post receives ") + (in.dir == Direction::forward ? "fwd" : "bwd") + " wave " +
             std::to_string(in.wave);
  return true;
}

// Packing is the device's work; the messages then move beside whatever it
// does next.
bool Simulator::post_send_box(const Program& prog, const Instr& in, SimDevice& dev, SimBox& box) const {
  dev.transfer_ms += box.dur_ms;
  for (int t : prog.transfers_of(in)) box.sent_bytes += l_.transfers[static_cast<size_t>(t)].bytes;
  box.track = SimTrack::communication;
  box.cat = "send";
  box.wave = in.wave;
  box.slice = in.slice;
  box.name = std::string("post sends ") + (in.dir == Direction::forward ? "fwd" : "bwd") + " of slice " +
             std::to_string(in.slice);
  return true;
}

// Transfer while one of its messages moves or the device packs or unpacks
// (the software parts are transfer work too), else wait.
bool Simulator::exchange_box(const Program& prog, const Instr& in, const InstrTimes& tm, int d, SimDevice& dev,
                             SimBox& box) const {
  std::vector<std::pair<double, double>> spans;
  for (int t : prog.transfers_of(in)) {
    const Transfer& x = l_.transfers[static_cast<size_t>(t)];
    if (x.src == x.dst) continue;
    const SimMessage& m = s_.messages[static_cast<size_t>(t)];
    spans.push_back({m.start_ms, m.end_ms});
    (x.src == d ? box.sent_bytes : box.received_bytes) += x.bytes;
  }
  spans.push_back({tm.reached, tm.packed});
  spans.push_back({tm.ended - tm.unpack_ms, tm.ended});
  const double moving = covered_ms(std::move(spans), tm.reached, tm.ended);
  dev.transfer_ms += moving;
  dev.wait_ms += box.dur_ms - moving;
  box.track = SimTrack::communication;
  box.cat = "exchange";
  box.wave = in.wave;
  box.name = in.dir == Direction::copy
                 ? std::string("exchange copy (TP copies)")
                 : std::string("exchange ") + short_name(in.dir) + " wave " + std::to_string(in.wave);
  return true;
}

// The wait for a started all-reduce or all-gather (allreduce_wait,
// allgather_wait). Blocked from reached to ended: on the collective while
// it ran (exposed), else waiting for the group to start it. The rest of
// the collective ran behind this device's other work (hidden).
bool Simulator::allreduce_wait_box(const Instr& in, const InstrTimes& tm, SimDevice& dev, SimBox& box) const {
  const double cb = s_.bucket_begin[static_cast<size_t>(collective_of(l_, in))];
  const double ce = s_.bucket_end[static_cast<size_t>(collective_of(l_, in))];
  const double exposed = std::max(0.0, tm.ended - std::max(tm.reached, cb));
  dev.sync_ms += exposed;
  dev.wait_ms += box.dur_ms - exposed;
  dev.hidden_sync_ms += (ce - cb) - exposed;
  if (box.dur_ms <= 0) return false;
  // On the communication track: it ends with the collective, so it nests
  // with the collective's box there.
  box.track = SimTrack::communication;   // began == reached: the box is the blocked time
  box.cat = "wait";
  box.bucket = in.bucket;
  box.name = (is_gather(in.kind) ? "wait for all-gather of bucket " : "wait for all-reduce of bucket ") +
             std::to_string(in.bucket);
  return true;
}

// The all-reduce's (or all-gather's, or the gradient norm's) box, from
// its begin to its end; a blocking one that waited for its group first
// also gets a wait box (into `boxes`) and counts as sync (a started one,
// allreduce_start or allgather_start, is counted at its wait).
void Simulator::allreduce_box(const Instr& in, const InstrTimes& tm, SimDevice& dev, SimBox& box,
                              std::vector<SimBox>& boxes) const {
  const bool norm = in.kind == InstrKind::grad_norm;   // over every device, of no bucket
  const bool started = starts_collective(in.kind);
  const bool gather = is_gather(in.kind);
  if (!started && tm.began > tm.reached) {
    SimBox wait = box;
    wait.track = SimTrack::communication;
    wait.cat = "wait";
    wait.name = norm     ? std::string("wait for the gradient norm")
                : gather ? "wait for all-gather of bucket " + std::to_string(in.bucket)
                         : "wait for bucket " + std::to_string(in.bucket);
    wait.bucket = in.bucket;
    wait.start_ms = tm.reached;
    wait.dur_ms = tm.began - tm.reached;
    dev.wait_ms += wait.dur_ms;
    boxes.push_back(std::move(wait));
  }
  if (!started) dev.sync_ms += box.dur_ms;
  box.track = SimTrack::communication;
  box.cat = gather ? "allgather" : "allreduce";
  box.bucket = in.bucket;
  if (norm) {
    box.sent_bytes = kNormBytes;
    box.name = "gradient norm (" + std::to_string(l_.devices) + " devices)";
    return;
  }
  const Bucket& b = l_.buckets[static_cast<size_t>(in.bucket)];
  // With sharded state a bucket's sum is a reduce-scatter of its padded buffer.
  box.sent_bytes = gather || l_.sharded_state ? l_.gather_bytes(in.bucket) : b.bytes;
  box.name = (gather ? "all-gather bucket " : l_.sharded_state ? "reduce-scatter bucket " : "all-reduce bucket ") +
             std::to_string(in.bucket) + " (" + std::to_string(b.devices.size()) + " devices)";
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
  std::vector<double> compute(n, 0.0), forward(n, 0.0), sync(n, 0.0), reduce(n, 0.0);
  if (options.price_compute)
    for (size_t s = 0; s < lowered.slices.size() && s < slice_ms.size(); ++s)
      for (int d : lowered.slices[s].devices) {
        compute[static_cast<size_t>(d)] += slice_ms[s];
        forward[static_cast<size_t>(d)] += slice_ms[s] * forward_share_of(options, s);
      }
  for (size_t k = 0; k < lowered.buckets.size(); ++k) {
    const double ms = bucket_ms(lowered, k, cost, options);
    for (int d : lowered.buckets[k].devices) sync[static_cast<size_t>(d)] += ms;
  }
  reduce = sync;
  // With sharded optimizer state, every bucket's all-gather as well
  // (gather_ms is 0 without).
  if (lowered.sharded_state)
    for (size_t k = 0; k < lowered.buckets.size(); ++k) {
      const double ms = gather_ms(lowered, k, cost, options);
      for (int d : lowered.buckets[k].devices) sync[static_cast<size_t>(d)] += ms;
    }
  // Blocking: compute, then every collective. Overlapped: a device's
  // collectives run one after another and it waits for each; its
  // all-reduces none before its forward pass is done (the first starts
  // after a backward). When its all-gathers are started as its program
  // opens (Lowered::gathers_at_start) they may run beside its forward
  // pass: then only all its collectives one after another.
  const bool overlap = options.sync.value_or(GradSync{}).overlap;
  double bound = 0;
  for (size_t d = 0; d < n; ++d)
    bound = std::max(bound, !overlap                   ? compute[d] + sync[d]
                            : lowered.gathers_at_start ? std::max({compute[d], forward[d] + reduce[d], sync[d]})
                                                       : std::max(compute[d], forward[d] + sync[d]));
  // Summed in another order than the simulation's clock: a few ulps below.
  return bound * (1 - 1e-12);
}

double program_lower_bound_ms(const Lowered& lowered, const std::vector<double>& slice_ms, const CostModel& cost,
                              const SimOptions& options) {
  return Simulator(lowered, slice_ms, cost, 0, options).lower_bound();
}

namespace {
// SimOptions' forward shares: each in [0, 1], one per slice when listed;
// no replay in a bounded simulation.
Status check_options(const SimOptions& options, size_t slices) {
  if ((!options.replay_ms.empty() || !options.replay_start_ms.empty()) &&
      options.stop_after_ms < std::numeric_limits<double>::infinity())
    return Error{"simulate: a replay cannot be bounded (stop_after_ms)"};
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
  SPINDLE_TRY(check_options(options, lowered.slices.size()));
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
  return PlanSimulation(plan, context, cost, options.sync ? *options.sync : planned_sync(plan)).simulate(options);
}

LowerOptions simulation_lowering(const std::optional<GradSync>& sync) {
  LowerOptions lite;
  lite.deps = false;
  lite.runtime_maps = false;
  lite.sync = sync;
  return lite;
}

PlanSimulation::PlanSimulation(const Plan& plan, const LowerContext& context, const CostModel& cost,
                               const GradSync& sync)
    : plan_(plan), context_(context), cost_(cost), lite_(simulation_lowering(sync)) {}

Result<Simulation> PlanSimulation::simulate(const SimOptions& options) {
  if (options.sync && !(*options.sync == lite_.sync))
    return Error{"simulate: the options' gradient sync is not the one the plan was lowered with"};
  if (!lowered_) {
    lowered_ = lower_header(plan_, context_, lite_);
    slice_ms_ = lowered_slice_ms(plan_);
  }
  if (!*lowered_) return lowered_->error();
  Lowered& lowered = **lowered_;
  // Measured forward shares, by slice (its MetaOp's workload), where the
  // profile has them; the others keep options.forward_share.
  // An empty sync is the lowering's.
  const SimOptions* opts = &options;
  SimOptions filled;
  const bool shares = cost_.has_forward_shares() && options.slice_forward_share.empty();
  if (shares || !options.sync) {
    filled = options;
    filled.sync = lite_.sync;
    opts = &filled;
  }
  if (shares) {
    filled.slice_forward_share.reserve(lowered.slices.size());
    for (const LoweredSlice& s : lowered.slices) {
      const double f = cost_.forward_share(plan_.metaops[static_cast<size_t>(s.metaop)].workload);
      filled.slice_forward_share.push_back(f >= 0 ? f : options.forward_share);
    }
  }
  SPINDLE_TRY(check_options(*opts, lowered.slices.size()));
  // A bounded simulation that cannot finish in time ends before the
  // programs are built.
  if (device_lower_bound_ms(lowered, slice_ms_, cost_, *opts) > opts->stop_after_ms) {
    return stopped_at_bound();
  }
  if (!programs_) programs_ = lower_programs(plan_, context_, lowered, lite_);
  SPINDLE_TRY(*programs_);
  // The shares were checked above: the simulator itself, not simulate().
  auto sim = Simulator(lowered, slice_ms_, cost_, plan_.devices_per_island, *opts).run();
  if (!sim) return sim;
  sim->bucket_starts_matter = lowered.bucket_starts_matter;
  // Name compute boxes after their MetaOps, as the planned trace does.
  for (SimBox& box : sim->boxes) {
    if (box.cat != "forward" && box.cat != "backward") continue;
    const LoweredSlice& s = lowered.slices[static_cast<size_t>(box.slice)];
    const PlanMetaOp& m = plan_.metaops[static_cast<size_t>(s.metaop)];
    box.name = m.task + " " + m.workload.op + " x" + std::to_string(s.ops.size()) +
               (box.cat == "forward" ? " fwd" : " bwd");
  }
  return sim;
}

Result<double> simulated_compute_gap(const Plan& plan, const Model& model, const OpGraph& graph,
                                     const CostModel& cost) {
  const Result<LowerContext> context = lower_context(model, graph);
  if (!context) return context.error();
  return simulated_compute_gap(plan, *context, cost);
}

Result<double> simulated_compute_gap(const Plan& plan, const LowerContext& context, const CostModel& cost) {
  SimOptions compute_only;
  compute_only.price_communication = false;
  compute_only.price_optimizer = false;   // the relaxed optimum counts forward and backward alone
  compute_only.timeline = false;
  auto sim = simulate_plan(plan, context, cost, compute_only);
  if (!sim) return sim.error();
  const double relaxed = plan.predicted.relaxed_optimum_ms;
  return relaxed > 0 ? sim->iteration_ms / relaxed - 1.0 : 0.0;
}

}  // namespace spindle::plan
