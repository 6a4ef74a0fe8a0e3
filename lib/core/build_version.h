// Which vlmtrain this is and where it runs, for the records a run leaves (metrics.jsonl's "run"
// record, the run lock's note, event file names): the version and the commit of the checkout it
// was built from ("-dirty" for edits), from the generated vlm/build_info.h
// (lib/core/build_info.h.in), and the host. A small torch-free file of its own, so that a new
// commit recompiles it alone.
#pragma once

#include <string>

namespace vlm {

std::string build_version();  // "0.1.0"
std::string build_commit();   // "0123456789ab" or "0123456789ab-dirty" or "unknown"
std::string host_name();      // gethostname(), "" when unknown

}  // namespace vlm
