#include "libexec/comm/watchdog.h"

#include <chrono>
#include <cstdio>
#include <thread>

namespace spindle::exec {

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Waited wait_or_give_up(const std::function<bool()>& done, const std::function<std::string()>& error,
                       double timeout_s, const std::function<double()>& now_s,
                       const std::function<void()>& pause) {
  const std::function<double()> now = now_s ? now_s : steady_seconds;
  const double start = now();
  Waited w;
  for (bool first = true;; first = false) {
    if (!first) {
      if (std::string e = error(); !e.empty()) {
        w.end = WaitEnd::failed;
        w.error = std::move(e);
        break;
      }
      if (now() - start > timeout_s) {
        w.end = WaitEnd::timed_out;
        break;
      }
      if (pause) pause();
      else std::this_thread::yield();
    }
    if (done()) {
      w.end = WaitEnd::done;
      break;
    }
  }
  w.waited_s = now() - start;
  return w;
}

std::string gave_up_message(const Waited& w, int world_rank, const std::string& what, int group_size) {
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.1f", w.waited_s);
  const std::string head = "rank " + std::to_string(world_rank) + ": " + what + " over a group of " +
                           std::to_string(group_size) + " ranks ";
  if (w.end == WaitEnd::failed)
    return head + "failed after " + waited + " s: " + w.error + " (a peer failed or left; see its log)";
  return head + "did not complete within " + waited +
         " s (--comm-timeout): a peer stalled, died or never reached the same call; see the other ranks' logs";
}

}  // namespace spindle::exec
