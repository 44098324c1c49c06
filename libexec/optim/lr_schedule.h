// The learning rate of each training step: linear warm-up, then constant,
// linear or cosine decay to a floor, as Megatron-LM's
// OptimizerParamScheduler.get_lr computes it (--lr-warmup-iters,
// --lr-decay-iters, --lr-decay-style, --min-lr there; the same shapes as
// Hugging Face's get_linear/cosine_schedule_with_warmup). Pure: the rate
// is a function of the step alone, so a resumed run (on any plan)
// continues the schedule where the checkpoint left it.
//
// Step s (1-based, as spindle-run logs it) is at schedule position
// n = s - 1, the optimizer steps taken before it (Megatron and Hugging Face
// advance the schedule after each step, so the first step uses position 0):
//   n <= W (W > 0):  lr = max_lr * n / W              (warm-up from 0)
//   constant:        lr = max_lr
//   n > D:           lr = min_lr
//   otherwise, r = (n - W) / (D - W):
//     linear:        lr = min_lr + (1 - r) (max_lr - min_lr)
//     cosine:        lr = min_lr + (cos(pi r) + 1) / 2 (max_lr - min_lr)
// with W = warmup_steps, D = decay_steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace spindle::exec {

enum class LrDecay { constant, linear, cosine };

struct LrSchedule {
  double max_lr = 3e-3;       // the peak rate (spindle-run --lr)
  double min_lr = 0;          // the floor decay ends at (--min-lr)
  int64_t warmup_steps = 0;   // W (--lr-warmup-steps); 0: no warm-up
  int64_t decay_steps = 0;    // D (--lr-decay-steps; spindle-run's default: --steps)
  LrDecay decay = LrDecay::constant;
};

// Whether a and b give every step the same rate as AdamW applies it: the
// peaks equal as floats (a checkpoint records the float AdamW used), the
// rest exactly.
bool same_lr_schedule(const LrSchedule& a, const LrSchedule& b);

// "constant", "linear", "cosine".
const char* lr_decay_name(LrDecay decay);
// The inverse of lr_decay_name; nullopt for any other text.
std::optional<LrDecay> parse_lr_decay(const std::string& name);

// "" when `s` is a schedule lr_at can follow, else what is wrong (naming
// spindle-run's flags): max_lr finite in (0, 1]; min_lr finite in
// [0, max_lr]; warmup_steps >= 0; with linear or cosine decay,
// decay_steps > warmup_steps (the decay needs steps of its own).
std::string check_lr_schedule(const LrSchedule& s);

// The rate of step `step` (>= 1) under `s` (check_lr_schedule passed).
double lr_at(const LrSchedule& s, int64_t step);

// One line for logs: "constant 0.003", "warm-up 100 steps to 0.003", or
// "warm-up 100 steps to 0.003, cosine decay to 0.0003 at step 1001" (the
// step from which the floor holds: D + 1).
std::string describe_lr_schedule(const LrSchedule& s);

}  // namespace spindle::exec
