#include "libexec/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "libplan/util/units.h"

namespace spindle::exec {

const char* lr_decay_name(LrDecay decay) {
  switch (decay) {
    case LrDecay::linear: return "linear";
    case LrDecay::cosine: return "cosine";
    case LrDecay::constant: break;
  }
  return "constant";
}

std::optional<LrDecay> parse_lr_decay(const std::string& name) {
  for (LrDecay d : {LrDecay::constant, LrDecay::linear, LrDecay::cosine})
    if (name == lr_decay_name(d)) return d;
  return std::nullopt;
}

std::string check_lr_schedule(const LrSchedule& s) {
  // AdamW steps with the rate as a float: one that rounds to 0 there is 0.
  if (!(std::isfinite(s.max_lr) && static_cast<float>(s.max_lr) > 0 && s.max_lr <= 1))
    return "--lr " + plan::number_text(s.max_lr) + ": expected a learning rate above 0 and at most 1" +
           (s.max_lr > 0 && static_cast<float>(s.max_lr) == 0 ? " (as a float: it is 0 there)" : "");
  if (!(std::isfinite(s.min_lr) && s.min_lr >= 0 && s.min_lr <= s.max_lr))
    return "--min-lr " + plan::number_text(s.min_lr) + ": expected a rate from 0 to --lr (" +
           plan::number_text(s.max_lr) + ")";
  if (s.warmup_steps < 0) return "--lr-warmup-steps " + std::to_string(s.warmup_steps) + ": expected 0 or more";
  if (s.decay != LrDecay::constant && s.decay_steps <= s.warmup_steps)
    return "--lr-decay-steps " + std::to_string(s.decay_steps) + " (default: --steps): " + lr_decay_name(s.decay) +
           " decay needs more steps than the warm-up (--lr-warmup-steps " + std::to_string(s.warmup_steps) + ")";
  return "";
}

bool same_lr_schedule(const LrSchedule& a, const LrSchedule& b) {
  return static_cast<float>(a.max_lr) == static_cast<float>(b.max_lr) && a.min_lr == b.min_lr &&
         a.warmup_steps == b.warmup_steps && a.decay_steps == b.decay_steps && a.decay == b.decay;
}

double lr_at(const LrSchedule& s, int64_t step) {
  const int64_t n = step - 1;   // optimizer steps before this one
  if (s.warmup_steps > 0 && n <= s.warmup_steps)
    return s.max_lr * static_cast<double>(n) / static_cast<double>(s.warmup_steps);
  if (s.decay == LrDecay::constant) return s.max_lr;
  if (n > s.decay_steps) return s.min_lr;
  const double r = static_cast<double>(n - s.warmup_steps) / static_cast<double>(s.decay_steps - s.warmup_steps);
  const double coeff = s.decay == LrDecay::linear ? 1.0 - r : 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
  return s.min_lr + coeff * (s.max_lr - s.min_lr);
}

std::string describe_lr_schedule(const LrSchedule& s) {
  std::string text;
  if (s.warmup_steps > 0)
    text = "warm-up " + std::to_string(s.warmup_steps) + (s.warmup_steps == 1 ? " step to " : " steps to ");
  text += plan::number_text(static_cast<float>(s.max_lr));   // as the checkpoint records it
  if (s.decay == LrDecay::constant) return (s.warmup_steps > 0 ? "" : "constant ") + text;
  return text + ", " + lr_decay_name(s.decay) + " decay to " + plan::number_text(s.min_lr) + " at step " +
         std::to_string(s.decay_steps + 1);
}

}  // namespace spindle::exec
