// The compute-backend interface (docs/architecture.md, convention 6): allocate, copy,
// synchronise, run an op. One folder per backend (backend/cpu/, later
// backend/cuda/). The executor holds one Backend per rank and never touches
// tensor memory except through it.
//
// Contracts:
//  - allocate returns a zero-filled tensor in the backend's memory
//    (device() says where). Host tensors are always valid inputs to copy.
//  - copy(src, dst): same element count; either side may be host memory or
//    this backend's memory. It may be asynchronous on a device backend: call
//    synchronize() before reading dst on the host.
//  - add(src, dst): dst[i] += src[i], same element count, both in this
//    backend's memory (output gradients that several consumers add up).
//  - forward/backward run one operator (ops/op.h: inputs, outputs and
//    gradients per kind) on tensors in the backend's memory; the Op's
//    parameters (its ParamSet) must live there too. Ops with a TP group call
//    its Comm from inside (host staging is the backend's business).
//  - adamw_step updates a parameter in place (optim/adamw.h); adamw_steps
//    makes several such updates, each exactly as adamw_step would (the
//    default runs them one by one; the CUDA backend runs them in one
//    launch per 32 tensors, since one launch per tensor costs more than
//    the update of a small tensor: 0.55 against 0.011 ms predicted for
//    tiny-clip's 49,840 values on an H200).
//  - A Backend is used by one thread at a time.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "libexec/ops/op.h"
#include "libexec/optim/adamw.h"
#include "libexec/tensor.h"

namespace spindle::exec {

// One AdamW update: a parameter's value, its gradient and moments (same
// element count, all in one memory) and the step t >= 1 it takes.
struct AdamWUpdate {
  int64_t step = 0;
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;
  Tensor* m = nullptr;
  Tensor* v = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;  // "cpu", "cuda"
  virtual Device device() const = 0;

  virtual Tensor allocate(Shape shape) = 0;   // zero-filled
  // Sets every value of `t` (host or this backend's memory) to 0, where it
  // is: views keep seeing it (a bucket's gradients, Executor::zero_grads).
  virtual void zero(Tensor& t) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // Waits until the work this backend queued is done (copies to host
  // memory included); not for communicators' own streams.
  virtual void synchronize() = 0;
  virtual void add(const Tensor& src, Tensor& dst) = 0;

  virtual Tensor forward(Op& op, std::span<const Tensor> inputs) = 0;
  virtual std::vector<Tensor> backward(Op& op, const Tensor& grad_output) = 0;
  // Drops what forward saved for `op`'s backward; backward drops it too.
  // For a forward with no backward after it (an evaluation).
  virtual void release_saved(Op& op) = 0;
  virtual void adamw_step(const AdamWConfig& cfg, int64_t step, Tensor& param,
                          const Tensor& grad, Tensor& m, Tensor& v) = 0;
  virtual void adamw_steps(const AdamWConfig& cfg, std::span<const AdamWUpdate> updates);
  // The sum of the squares of every value of `tensors` (host or this
  // backend's memory), in double and in one fixed order, so the same
  // tensors give the same sum on every call (gradient clipping's norm,
  // Executor::norm_sum). The default reads the values on the host,
  // copying a tensor that is elsewhere there first.
  virtual double sum_squares(std::span<const Tensor> tensors);

  // Bytes of this backend's memory in use at most since the last
  // reset_peak_bytes(): the CPU backend's, the host tensors of the process
  // (host_tensor_peak_bytes: parameters, gradients, optimizer state,
  // activations, the operators' saved state and the executor's buffers);
  // the CUDA backend's, its stream-ordered pool (every tensor and
  // operator buffer it allocates; not cuBLAS's workspace, NCCL's buffers
  // or the CUDA context). The figure spindle-run compares with the plan's
  // memory count. Per process: ranks that share one (the fake
  // communicators' threads) share the CPU figure and reset it for each
  // other, so it means something only with one rank per process, as
  // spindle-run runs.
  virtual int64_t peak_bytes() = 0;
  virtual void reset_peak_bytes() = 0;
};

// "cpu" is always built. Returns nullptr for a name not built into this
// binary (e.g. "cuda" without CUDA); see backend_names(). "cuda" built but
// with no device visible throws std::runtime_error saying so.
std::unique_ptr<Backend> make_backend(std::string_view name);
std::vector<std::string_view> backend_names();  // those built in, "cpu" first

// Host threads a rank uses for its own host-side work (seeding parameters,
// drawing synthetic data) when its backend computes on `device` and it
// shares a node of `cores` cores with `ranks_on_node` ranks: 1 on the host
// (each rank already takes a core), else cores / ranks_on_node (at least 1).
int host_threads_for(Device device, int cores, int ranks_on_node);

}  // namespace spindle::exec
