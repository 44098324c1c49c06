// Reader and writer of the wave plan JSON (spec/plan.md), in one place.
#pragma once

#include <string>

#include "libplan/plan/plan.h"
#include "libplan/util/status.h"

namespace spindle::plan {

// Deterministic bytes: sorted keys, fixed float formatting (3 decimals for
// ms), one trailing newline. decode(encode(p)) encodes to the same bytes.
std::string plan_to_json(const Plan& plan);

// Rejects another `format`, a newer `version` (with a hint to upgrade),
// missing keys and wrong types, naming the file and key path.
Result<Plan> parse_plan_string(const std::string& json_text, const std::string& path);
Result<Plan> load_plan(const std::string& path);

}  // namespace spindle::plan
