// A small file written whole or not at all: a temporary file of a unique name in the target's
// folder (mkstemp: processes on several nodes may share a pid), written, flushed to disk, then
// renamed over the target, so a reader sees the old file or the new one, never half of one.
// The memory calibration file and WebDataset shard indexes are written this way.
#pragma once

#include <string>
#include <string_view>

namespace vlm {

// Empty on success; otherwise what failed ("create T: No space left on device"), the
// temporary file removed and the target untouched.
std::string write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace vlm
