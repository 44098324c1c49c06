// Fixtures shared by the executor, checkpoint, evaluation and export tests:
// a scratch folder, a shipped model, one device running a plan.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "libexec/backend/backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/exec/executor.h"
#include "libplan/model/model.h"
#include "test/scratch.h"

namespace spindle::exec::test {

using spindle::testutil::TempDir;   // test/scratch.h

// configs/models/NAME.yaml, which must parse.
inline plan::Model shipped_model(const std::string& name) {
  auto m = plan::load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/" + name + ".yaml");
  REQUIRE(m.ok());
  return *m;
}

// One device (SelfComm, CPU backend) executing `plan` with `options`.
struct OneDevice {
  SelfComm world;
  std::unique_ptr<Backend> backend = make_backend("cpu");
  std::unique_ptr<Executor> ex;
  OneDevice(const plan::Model& model, const plan::Plan& plan, const ExecOptions& options = {}) {
    GroupComms groups;
    groups[{0}] = std::make_unique<SelfComm>();
    ex = std::make_unique<Executor>(model, plan, world, std::move(groups), *backend, options);
  }
};

}  // namespace spindle::exec::test
